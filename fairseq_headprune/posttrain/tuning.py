"""Layer-wise least-squares tuning of the kept masks.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", §4.3): a pruned
layer's output is linear in its kept masks — attention Σ_h m_h·(head_h·W_O[:, h]) + b, FFN
Σ_j m_j·(act_j·W2[:, j]) + b — so the mask values that best reproduce the unpruned layer's
output are a least-squares solution. Layers are tuned in order (encoder layers, then decoder
layers, which see the pruned and tuned encoder's memory): each layer's inputs come from the
pruned model with every earlier layer tuned; its target is the unpruned model's output of
that layer on the same sentences, residual included (Kwon et al.'s eq. 10: x' + layer(x')):
the pruned sublayer is asked to make up for what the earlier layers changed in its residual
x, not only to reproduce layer(x'). The solution is ridge-regularised towards 1 and clamped to
[-10, 10], as Kwon et al. do; the values fold into ``out_proj`` / ``fc2`` columns at export.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.sites import (
    DEC_ENC,
    DEC_FFN,
    DEC_SELF,
    ENC_FFN,
    ENC_SELF,
    FFN_SITES,
    Unit,
    attention_modules,
    ffn_layers,
)

logger = logging.getLogger(__name__)

RIDGE = 1e-4  # λ relative to the mean of diag(AᵀA)
CLAMP = 10.0


class _Stop(Exception):
    """Raised by a capture hook once the layer of interest has run."""


def _residual_call(model: nn.Module, unit: Unit) -> tuple[nn.Module, int]:
    """(the transformer layer of ``unit``, which of its ``residual_connection`` calls adds
    the unit's output): fairseq's layers add self-attention, then decoder–encoder attention,
    then the FFN."""
    if unit[0].startswith("enc"):
        layer = model.encoder.layers[unit[1]]
        return layer, int(unit[0] == ENC_FFN)
    layer = model.decoder.layers[unit[1]]
    cross = int(getattr(layer, "encoder_attn", None) is not None)
    return layer, {DEC_SELF: 0, DEC_ENC: 1, DEC_FFN: 1 + cross}[unit[0]]


def tuning_order(model: nn.Module) -> list[Unit]:
    order: list[Unit] = []
    for i in range(len(model.encoder.layers)):
        order += [(ENC_SELF, i), (ENC_FFN, i)]
    for i in range(len(model.decoder.layers)):
        order += [(DEC_SELF, i), (DEC_ENC, i), (DEC_FFN, i)]
    return order


def unit_modules(model: nn.Module, unit: Unit) -> tuple[nn.Module, nn.Module]:
    """(the unit's projection: out_proj or fc2, the attention module or layer)."""
    if unit[0] in FFN_SITES:
        layer = next(layer for s, i, layer in ffn_layers(model) if (s, i) == unit)
        return layer.fc2, layer
    attn = next(a for s, i, a in attention_modules(model) if (s, i) == unit)
    return attn.out_proj, attn


def real_positions(unit: Unit, batch: dict, pad: int) -> Tensor:
    """(T·B,) True at real (non-pad) positions, in the (T, B) order of layer tensors."""
    net = batch["net_input"]
    tokens = net["src_tokens"] if unit[0].startswith("enc") else net["prev_output_tokens"]
    return (tokens != pad).t().reshape(-1)


def capture(model, masks: Masks, unit: Unit, batch: dict, teacher: bool) -> dict:
    """Run ``model`` on ``batch`` up to ``unit``'s residual connection and return the
    projection's inputs (``heads`` or ``x``), its output ``y`` and the ``residual`` added to it.

    ``teacher``: every mask 1 (the unpruned model); otherwise the current masks, with this
    unit's kept masks at 1 so that its inputs are the unscaled heads/activations.
    """
    proj, owner = unit_modules(model, unit)
    got: dict = {}
    saved = masks.snapshot()
    if teacher:
        masks.set(masks.ones())
    else:
        masks.set({unit: (saved[unit] != 0).float()})
    if unit[0] in FFN_SITES:
        pre = proj.register_forward_pre_hook(lambda m, inp: got.__setitem__("x", inp[0]))
    else:
        owner.head_gate.observer = lambda heads, gate: got.__setitem__("heads", heads)
        pre = None

    post = proj.register_forward_hook(lambda m, inp, out: got.__setitem__("y", out))
    layer, call = _residual_call(model, unit)
    add = layer.residual_connection
    calls = []

    def residual_connection(x, residual):
        if len(calls) == call:
            got["residual"] = residual
            raise _Stop
        calls.append(None)
        return add(x, residual)

    layer.residual_connection = residual_connection
    net = batch["net_input"]
    try:
        with torch.no_grad():
            model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    except _Stop:
        pass
    finally:
        del layer.residual_connection
        post.remove()
        if pre is not None:
            pre.remove()
        if not unit[0].endswith("ffn"):
            owner.head_gate.observer = None
        masks.set(saved)
    return got


def residual_target(
    model, masks: Masks, unit: Unit, batch: dict, pad: int, teacher_weights=nullcontext
) -> tuple[dict, Tensor, Tensor]:
    """(the pruned model's :func:`capture`, its real positions, the target (N, E) there): what
    ``unit``'s projection must output for the pruned layer to reproduce the unpruned model's
    residual sum x' + layer(x'), i.e. y' + x' − x. ``teacher_weights``: a context that puts the
    unpruned model's weights in place for the teacher pass."""
    real = real_positions(unit, batch, pad)
    with teacher_weights():
        teacher = capture(model, masks, unit, batch, teacher=True)
    got = capture(model, masks, unit, batch, teacher=False)
    t = teacher["y"] + teacher["residual"] - got["residual"]
    return got, real, t.reshape(-1, t.shape[-1])[real].double()


def gram_terms(model, masks: Masks, unit: Unit, got: dict, keep: Tensor, real: Tensor, t: Tensor):
    """(AᵀA, Aᵀt) of one batch: A's column i is kept unit i's additive share of the
    projection output at every real position (``t``: (N, E) targets at those positions)."""
    proj, _ = unit_modules(model, unit)
    w = proj.weight.detach().double()  # (E, units·d)
    if unit[0] in FFN_SITES:  # share_j = act_j·W2[:, j]: factor through W2 (no (N, k, E))
        x = got["x"].reshape(-1, got["x"].shape[-1])[real][:, keep].double()  # (N, k)
        w_k = w[:, keep]  # (E, k)
        return (x.t() @ x) * (w_k.t() @ w_k), ((t @ w_k) * x).sum(0)
    heads = got["heads"]  # (T, B, H, d)
    heads = heads.reshape(-1, *heads.shape[2:])[real][:, keep].double()  # (N, k, d)
    w_heads = w.unflatten(1, (-1, heads.shape[-1]))[:, keep]  # (E, k, d)
    base = masks.base(unit)[keep].double()  # a trained gate's fixed factor
    c = torch.einsum("nkd,ekd->nke", heads, w_heads) * base[None, :, None]  # (N, k, E)
    return torch.einsum("nke,nle->kl", c, c), torch.einsum("nke,ne->k", c, t)


def normal_equations(
    model, masks: Masks, unit: Unit, batches: list[dict]
) -> tuple[Tensor, Tensor, float, Tensor]:
    """(AᵀA (k, k), Aᵀt (k,), tᵀt, kept indices) over the calibration batches."""
    keep = (masks.values[unit] != 0).nonzero().flatten()
    proj, _ = unit_modules(model, unit)
    pad = model.decoder.dictionary.pad()
    gram = torch.zeros(len(keep), len(keep), dtype=torch.float64)
    rhs = torch.zeros(len(keep), dtype=torch.float64)
    tt = 0.0
    for batch in batches:
        got, real, t = residual_target(model, masks, unit, batch, pad)
        if proj.bias is not None:
            t = t - proj.bias.detach().double()
        g, r = gram_terms(model, masks, unit, got, keep, real, t)
        gram += g
        rhs += r
        tt += float((t * t).sum())
    return gram, rhs, tt, keep


def solve(gram: Tensor, rhs: Tensor) -> Tensor:
    """argmin ‖A m − t‖² + λ‖m − 1‖², clamped to [−CLAMP, CLAMP]."""
    lam = RIDGE * float(gram.diagonal().mean().clamp_min(1e-12))
    eye = torch.eye(len(rhs), dtype=gram.dtype)
    m = torch.linalg.solve(gram + lam * eye, rhs + lam)
    return m.clamp(-CLAMP, CLAMP)


def relative_error(gram: Tensor, rhs: Tensor, tt: float, m: Tensor) -> float:
    """‖A m − t‖² / ‖t‖² from the normal equations (``m``: a vector, or one column per
    output dimension with ``rhs`` = Aᵀt alike)."""
    return float((m * (gram @ m)).sum() - 2 * (m * rhs).sum() + tt) / max(tt, 1e-12)


def tune(model, masks: Masks, batches: list[dict]) -> dict[Unit, dict]:
    """Tune every layer's kept masks in place, in :func:`tuning_order`; return each layer's
    relative reconstruction error before (masks 0/1) and after."""
    report = {}
    for unit in tuning_order(model):
        if unit not in masks.values or not bool((masks.values[unit] != 0).any()):
            continue
        gram, rhs, tt, keep = normal_equations(model, masks, unit, batches)
        m = solve(gram, rhs)
        before = relative_error(gram, rhs, tt, torch.ones_like(m))
        report[unit] = {"before": before, "after": relative_error(gram, rhs, tt, m)}
        logger.info(f"tuned {unit[0]} layer {unit[1]}: relative error {report[unit]}")
        values = torch.zeros_like(masks.values[unit])
        values[keep] = m.float()
        masks.set({unit: values})
    return report
