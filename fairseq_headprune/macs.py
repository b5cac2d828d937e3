"""The plugin's multiply-add model of a transformer's encoder and beam search.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?", NeurIPS 2019) and Voita et
al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the
Rest Can Be Pruned", ACL 2019) count heads; Kwon et al. 2022 ("A Fast Post-Training Pruning
Framework for Transformers", NeurIPS 2022) prune heads and FFN neurons under a FLOP budget.
Every term here is linear in a layer's number of heads or FFN neurons, so it is written per
unit: :func:`mac_terms` gives the cost of one head of each attention layer and of one neuron
of each FFN, and the rest (the output layer). :func:`encoder_macs` and
:func:`generation_macs` sum it: ``fairseq-headprune bench`` predicts speed-ups with them, and
the post-training pruner (``posttrain``) searches under ``--budget macs:F`` with the terms.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from fairseq_headprune.sites import DEC_ENC, DEC_FFN, DEC_SELF, ENC_FFN, ENC_SELF, Unit

# {unit: (multiply-adds per head or neuron, heads or neurons)}
Terms = dict[Unit, tuple[int, int]]


def _per_head(attn: nn.Module, tq: int, tk: int) -> int:
    """Multiply-adds of one head of one attention call: q/k/v projections (queries over
    ``tq`` positions, keys/values over ``tk``), scores, weighted sum and its out_proj columns."""
    d = getattr(attn, "head_dim", 0)
    if not d:
        return 0
    e_out = attn.out_proj.out_features if hasattr(attn, "out_proj") else 0
    return (
        tq * attn.q_proj.in_features * d + 2 * tk * attn.kdim * d + 2 * tq * tk * d + tq * d * e_out
    )


def mac_terms(model: nn.Module, src_len: int, tgt_len: int = 0, beam: int = 1) -> tuple[int, Terms]:
    """(multiply-adds of no head or neuron, {unit: (multiply-adds per head or neuron, count)}).

    The encoder runs once over ``src_len`` positions; with ``tgt_len`` > 0, beam search runs
    ``tgt_len`` steps of ``beam`` hypotheses: per step one query over the self-attention cache
    and the encoder output, the FFN and the output layer. Keys/values of the encoder output are
    projected once per sentence.
    """
    terms: Terms = {}
    for i, layer in enumerate(model.encoder.layers):
        attn = layer.self_attn
        terms[ENC_SELF, i] = (_per_head(attn, src_len, src_len), attn.num_heads)
        terms[ENC_FFN, i] = (2 * src_len * layer.fc1.in_features, layer.fc1.out_features)
    if tgt_len <= 0:
        return 0, terms
    steps = range(1, tgt_len + 1)
    for i, layer in enumerate(model.decoder.layers):
        attn, cross = layer.self_attn, layer.encoder_attn
        d_self, d_cross = getattr(attn, "head_dim", 0), getattr(cross, "head_dim", 0)
        self_cost = sum(_per_head(attn, 1, 1) + 2 * t * d_self for t in steps)
        cross_cost = tgt_len * (_per_head(cross, 1, 0) + 2 * src_len * d_cross)
        kv_once = 2 * src_len * getattr(cross, "kdim", 0) * d_cross
        terms[DEC_SELF, i] = (beam * self_cost, attn.num_heads)
        terms[DEC_ENC, i] = (beam * cross_cost + kv_once, cross.num_heads)
        terms[DEC_FFN, i] = (beam * tgt_len * 2 * layer.fc1.in_features, layer.fc1.out_features)
    vocab = model.decoder.output_projection.weight.shape
    return beam * tgt_len * vocab[0] * vocab[1], terms


def prunable_macs(terms: Terms, counts: Mapping[Unit, int] | None = None) -> int:
    """Multiply-adds of the heads and neurons: each unit's cost × its count, or × ``counts[unit]``
    (the units kept) for the units ``counts`` names."""
    if counts is None:
        return sum(cost * n for cost, n in terms.values())
    return sum(terms[unit][0] * n for unit, n in counts.items())


def total_macs(constant: int, terms: Terms) -> int:
    """All multiply-adds: the constant plus every unit's cost × its count."""
    return constant + prunable_macs(terms)


def encoder_macs(model: nn.Module, src_len: int) -> int:
    """Multiply-adds of one encoder forward pass over ``src_len`` positions."""
    return total_macs(*mac_terms(model, src_len))


def generation_macs(model: nn.Module, src_len: int, tgt_len: int, beam: int) -> int:
    """Encoder once; per decoding step and beam: one query over the cache, FFN, output layer."""
    return total_macs(*mac_terms(model, src_len, tgt_len, beam))


def predicted_speedups(
    full: nn.Module, pruned: nn.Module, src_len: int, tgt_len: int, beam: int
) -> dict[str, float]:
    """Speed-ups of ``pruned`` over ``full`` that multiply-adds predict: the encoder forward,
    beam search, the decoder's share (beam search minus the encoder), and ``allowed``, the
    largest beam-search speed-up any pruning of heads and neurons gives (the rest stays)."""
    enc = {name: encoder_macs(m, src_len) for name, m in (("full", full), ("pruned", pruned))}
    gen = {
        name: generation_macs(m, src_len, tgt_len, beam)
        for name, m in (("full", full), ("pruned", pruned))
    }
    return {
        "encoder": enc["full"] / enc["pruned"],
        "generate": gen["full"] / gen["pruned"],
        "decoder": (gen["full"] - enc["full"]) / (gen["pruned"] - enc["pruned"]),
        "allowed": gen["full"] / (mac_terms(full, src_len, tgt_len, beam)[0] or 1),
    }
