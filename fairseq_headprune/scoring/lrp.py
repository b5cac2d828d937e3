"""Head relevance by layer-wise relevance propagation (gradient × input with frozen nonlinearities).

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019, §4) measure a head's relevance with LRP (Bach et
al. 2015, "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
Relevance Propagation"; Ding et al. 2017, "Visualizing and Understanding Neural Machine
Translation"): the relevance of the head's output to the top-1 logit, averaged over target
tokens, normalised over the heads of its layer.

Rules used here (``lrp_rules``): every nonlinearity is frozen at its forward value, so that
the network is, locally, a linear function of its inputs and biases and gradient × input is
conservative (Euler's theorem for degree-1 homogeneous functions):

- attention weights: ``q_proj`` and ``k_proj`` outputs are detached, so softmax(qkᵀ) is a
  constant and the attention output is linear in the values;
- LayerNorm: the standard deviation is detached, (x − μ)/σ̂ · γ + β is linear in x and β;
- activation: f(x) is written x · (f(x)/x) with the ratio detached (exact for ReLU, a
  linearisation for GELU & co.).

Then logit = Σ (input · ∂logit/∂input) over the embedding outputs (token and positional) and
every bias (tested to float precision). The relevance of head h is R_h = g_h · ∂logit/∂g_h at
the ``HeadGate`` seam, i.e. ⟨head output, ∂logit/∂head output⟩. One backward pass per batch
propagates the sum of the top-1 logits of all target positions (teacher forcing with the
reference); relevance is linear in the logit, so this is the sum of the per-token
relevances. The mean per target token is normalised per layer by Σ_h |R_h| (Voita normalise
each token before averaging; we average first, which weighs tokens by their relevance mass
but costs one backward pass instead of one per token).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from fairseq_headprune.scoring.base import Scores, ScoringModel, SiteScores


def _detach_output(module: nn.Module, inputs, output: Tensor) -> Tensor:
    return output.detach()


def _layer_norm_frozen_std(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    std = (x.var(-1, keepdim=True, unbiased=False) + ln.eps).sqrt().detach()
    y = (x - mu) / std
    return y * ln.weight + ln.bias if ln.elementwise_affine else y


def _frozen_activation(fn):
    def frozen(x: Tensor) -> Tensor:
        ratio = torch.where(x.abs() > 1e-12, fn(x) / x, torch.zeros_like(x))
        return x * ratio.detach()

    return frozen


@contextlib.contextmanager
def lrp_rules(sm: ScoringModel) -> Iterator[None]:
    """Freeze attention weights, LayerNorm scales and activations (see the module doc)."""
    handles = []
    for attn in sm.attn.values():
        handles.append(attn.q_proj.register_forward_hook(_detach_output))
        handles.append(attn.k_proj.register_forward_hook(_detach_output))
    norms = [m for m in sm.model.modules() if isinstance(m, nn.LayerNorm)]
    layers = [m for m in sm.model.modules() if hasattr(m, "activation_fn")]
    acts = [m.activation_fn for m in layers]
    try:
        for ln in norms:
            ln.forward = _layer_norm_frozen_std.__get__(ln)
        for layer, fn in zip(layers, acts):
            layer.activation_fn = _frozen_activation(fn)
        yield
    finally:
        for h in handles:
            h.remove()
        for ln in norms:
            ln.__dict__.pop("forward", None)
        for layer, fn in zip(layers, acts):
            layer.activation_fn = fn


def top1_logits(sm: ScoringModel, sample: dict) -> Tensor:
    """Sum over non-padding target positions of the largest output logit."""
    logits, _ = sm.model(**sample["net_input"])  # (B, T, V)
    mask = sample["target"].ne(sm.pad)  # (B, T)
    return logits.max(dim=-1).values[mask].sum()


class LRPRelevance:
    """Voita et al.'s head relevance (``lrp``, per layer normalised; ``lrp_raw``, mean per
    target token) under the ``lrp_rules``."""

    def __call__(self, sm: ScoringModel, batches: Iterable[dict]) -> Scores:
        total: SiteScores = sm.zeros()
        ntokens = 0
        with lrp_rules(sm):
            for sample in batches:
                values = {s: v.clone().requires_grad_(True) for s, v in sm.base.items()}
                with sm.gates(values):
                    logit = top1_logits(sm, sample)
                    grads = torch.autograd.grad(logit, list(values.values()))
                for (site, v), g in zip(values.items(), grads):
                    total[site] += (v.detach() * g).float()  # (L, H)
                ntokens += int(sample["target"].ne(sm.pad).sum())
        raw = {s: v / max(ntokens, 1) for s, v in total.items()}
        norm = {s: v / v.abs().sum(-1, keepdim=True).clamp_min(1e-20) for s, v in raw.items()}
        return {"lrp": norm, "lrp_raw": raw}


def input_relevance(sm: ScoringModel, sample: dict) -> tuple[float, float]:
    """(Σ top-1 logits, Σ relevance of all inputs and biases) under the LRP rules: equal
    when the rules make gradient × input conservative."""
    leaves: list[Tensor] = []

    def as_leaf(module, inputs, output: Tensor) -> Tensor:
        leaf = output.detach().requires_grad_(True)
        leaves.append(leaf)
        return leaf

    embeddings = [sm.model.encoder, sm.model.decoder]
    modules = [getattr(m, n, None) for m in embeddings for n in ("embed_tokens", "embed_positions")]
    handles = [m.register_forward_hook(as_leaf) for m in dict.fromkeys(modules) if m is not None]
    biases = [p for n, p in sm.model.named_parameters() if n.endswith("bias")]
    try:
        with lrp_rules(sm):
            logit = top1_logits(sm, sample)
            grads = torch.autograd.grad(logit, leaves + biases, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    total = sum(
        float((x.detach() * g).sum()) for x, g in zip(leaves + biases, grads) if g is not None
    )
    return float(logit.detach()), total
