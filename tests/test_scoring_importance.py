"""LRP conservation, gradient importance and ablation against independent computations."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from fairseq_headprune.scoring.base import ScoringModel
from fairseq_headprune.scoring.importance import (
    GradientImportance,
    full_pass_ablation,
    single_head_ablation,
)
from fairseq_headprune.scoring.lrp import LRPRelevance, input_relevance
from tests.helpers import build_model


def _scoring_model(arch: str = "transformer", *extra: str) -> ScoringModel:
    torch.manual_seed(0)
    model, d = build_model(arch, *extra)
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    return ScoringModel(model, task)


def _sample(sm: ScoringModel, seed: int = 0, src_len: int = 6, tgt_len: int = 5) -> dict:
    g = torch.Generator().manual_seed(seed)
    pad, eos = sm.pad, sm.eos
    src = torch.randint(4, 20, (3, src_len), generator=g)  # (B, S)
    src[:, -1] = eos
    src[0, :2] = pad  # left-padded
    prev = torch.randint(4, 20, (3, tgt_len), generator=g)  # (B, T)
    prev[:, 0] = eos
    target = torch.cat([prev[:, 1:], torch.full((3, 1), eos)], 1)
    prev[2, -1], target[2, -2:] = pad, pad  # right-padded target
    lengths = src.ne(pad).sum(1)
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {"id": torch.arange(3), "net_input": net_input, "target": target}


@pytest.mark.parametrize(
    "activation,norm",
    [
        ("relu", ()),
        ("gelu", ()),
        ("relu", ("--encoder-normalize-before", "--decoder-normalize-before")),
    ],
)
def test_lrp_is_conservative(activation, norm):
    """Σ relevance of embeddings and biases = Σ top-1 logits under the frozen rules, for
    post-norm and pre-norm layers (the latter with the encoder's and decoder's final
    LayerNorm)."""
    sm = _scoring_model("transformer", "--activation-fn", activation, *norm)
    assert (sm.model.encoder.layer_norm is not None) == bool(norm)
    logit, relevance = input_relevance(sm, _sample(sm))
    assert abs(relevance - logit) <= 1e-4 * abs(logit)


def test_lrp_head_relevance_is_normalised_per_layer():
    sm = _scoring_model()
    scores = LRPRelevance()(sm, [_sample(sm)])
    for site, v in scores["lrp"].items():
        torch.testing.assert_close(v.abs().sum(-1), torch.ones(v.shape[0]))
        assert v.shape == sm.shape(site)


def test_gradient_importance_matches_finite_differences():
    sm = _scoring_model("gated_transformer")
    sample = _sample(sm, seed=1)
    importance = GradientImportance()(sm, [sample])["importance_raw"]
    eps = 1e-2
    for site, layer, head in [("enc-self", 0, 1), ("dec-self", 1, 2), ("dec-enc", 0, 3)]:
        losses = []
        for sign in (1, -1):
            values = {s: v.clone() for s, v in sm.base.items()}
            values[site][layer, head] += sign * eps
            losses.append(sm.mean_loss([sample], values))
        fd = (losses[0] - losses[1]) / (2 * eps)  # ∂(mean NLL)/∂g
        gate = float(sm.base[site][layer, head])
        assert float(importance[site][layer, head]) == pytest.approx(abs(gate * fd), rel=2e-2)


def test_single_head_ablation_equals_the_model_without_that_head():
    sm = _scoring_model()
    sample = _sample(sm, seed=2)
    base_loss, delta = single_head_ablation(sm, [sample])
    site, layer, head = "dec-enc", 1, 2
    plain = copy.deepcopy(sm.model)  # gates are overridden by 1: remove the head by hand
    attn = {"dec-enc": plain.decoder.layers[layer].encoder_attn}[site]
    d = attn.head_dim
    with torch.no_grad():
        attn.out_proj.weight[:, head * d : (head + 1) * d] = 0.0
        out = plain(**sample["net_input"])
        lprobs = plain.get_normalized_probs(out, log_probs=True)  # (B, T, V)
        mask = sample["target"].ne(sm.pad)
        nll = -lprobs.gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)[mask].mean()
    assert float(delta[site][layer, head]) == pytest.approx(float(nll) - base_loss, abs=1e-5)
    assert (delta["enc-self"] != 0).any()


def test_fast_single_head_ablation_equals_full_passes_for_every_head():
    """Replaying the computation before the ablated head's layer changes no number: every
    head of all three attention types, two batches of different shapes, a gated model with
    one head closed (its Δ is 0, and the closed head stays closed in the others' passes)."""
    sm = _scoring_model("gated_transformer")
    sm.base["enc-self"][1, 3] = 0.0  # a head closed in the model
    sm.set_gates(sm.base)
    batches = [_sample(sm, seed=3), _sample(sm, seed=4, src_len=8, tgt_len=4)]
    expected_base, expected = full_pass_ablation(sm, batches)
    base_loss, delta = single_head_ablation(sm, batches)
    assert base_loss == expected_base
    assert set(delta) == {"enc-self", "dec-self", "dec-enc"}
    for site in delta:
        assert torch.equal(delta[site], expected[site]), site
        assert (delta[site] != 0).sum() >= delta[site].numel() - 1  # every open head counts
    assert float(delta["enc-self"][1, 3]) == 0.0
    # the model is left as it was: no replayed forward remains, the base gates are back
    assert sm.mean_loss(batches) == expected_base
    assert not any("forward" in m.__dict__ for m in sm.model.modules())
