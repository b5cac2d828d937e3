"""Layer-wise least-squares refit of the kept units' output projection (``--tune weights``).

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", §4.3) fit one
scalar per kept head or neuron (``tuning.py``). With the same calibration sentences, the same
layer order and the same target — the unpruned model's residual sum x' + layer(x') — this fits
every output weight of the kept units and the bias instead: the columns of ``out_proj`` that
the kept heads feed, or of ``fc2`` for the kept neurons. Each output dimension is a ridge
regression on the kept units' activations, regularised towards the original weights, solved
exactly from the normal equations: the layer-wise reconstruction of Frantar & Alistarh 2022
("Optimal Brain Compression"), applied after structured pruning. The fitted weights are
written into the live model so that later layers see them, and into the checkpoint at export.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.posttrain.tuning import (
    relative_error,
    residual_target,
    tuning_order,
    unit_modules,
)
from fairseq_headprune.sites import FFN_SITES, Unit

logger = logging.getLogger(__name__)

RIDGE = 1e-3  # λ relative to the mean of diag(XᵀX), towards the original weights


@contextmanager
def original_weights(originals: dict[nn.Linear, tuple[Tensor, Tensor | None]]) -> Iterator[None]:
    """Put the unpruned model's weights back into the refit projections for a while."""
    fitted = {p: (p.weight.data, None if p.bias is None else p.bias.data) for p in originals}
    try:
        for p, (w, b) in originals.items():
            p.weight.data = w
            if b is not None:
                p.bias.data = b
        yield
    finally:
        for p, (w, b) in fitted.items():
            p.weight.data = w
            if b is not None:
                p.bias.data = b


def columns(unit: Unit, keep: Tensor, head_dim: int) -> Tensor:
    """The projection's input columns that the kept units feed."""
    if unit[0] in FFN_SITES:
        return keep
    return (keep[:, None] * head_dim + torch.arange(head_dim)).flatten()


def features(masks: Masks, unit: Unit, got: dict, keep: Tensor, real: Tensor, bias: bool):
    """(N, p[+1]): the kept units' inputs to the projection at real positions (a trained
    gate's fixed factor included), and a column of ones when the projection has a bias."""
    if unit[0] in FFN_SITES:
        x = got["x"].reshape(-1, got["x"].shape[-1])[real][:, keep]
    else:
        heads = got["heads"]  # (T, B, H, d)
        heads = heads.reshape(-1, *heads.shape[2:])[real][:, keep]
        x = (heads * masks.base(unit)[keep][None, :, None].to(heads)).flatten(1)
    x = x.double()
    return torch.cat([x, x.new_ones(len(x), 1)], 1) if bias else x


def refit(model: nn.Module, masks: Masks, batches: list[dict]) -> tuple[dict, dict[str, Tensor]]:
    """Refit every layer in :func:`tuning.tuning_order` in place; return each layer's relative
    reconstruction error before (original weights) and after, and the new weights by
    parameter name (the kept units' columns in place, the others untouched)."""
    names = {m: n for n, m in model.named_modules()}
    pad = model.decoder.dictionary.pad()
    originals: dict[nn.Linear, tuple[Tensor, Tensor | None]] = {}
    report, weights = {}, {}
    for unit in tuning_order(model):
        if unit not in masks.values or not bool((masks.values[unit] != 0).any()):
            continue
        keep = (masks.values[unit] != 0).nonzero().flatten()
        proj, owner = unit_modules(model, unit)
        bias = proj.bias is not None
        head_dim = 1 if unit[0] in FFN_SITES else owner.head_dim
        cols = columns(unit, keep, head_dim)
        size = len(cols) + int(bias)
        gram = torch.zeros(size, size, dtype=torch.float64)
        cross = torch.zeros(size, proj.out_features, dtype=torch.float64)
        tt = 0.0
        for batch in batches:
            got, real, t = residual_target(
                model, masks, unit, batch, pad, lambda: original_weights(originals)
            )
            a = features(masks, unit, got, keep, real, bias)
            gram += a.t() @ a
            cross += a.t() @ t
            tt += float((t * t).sum())
        old = proj.weight.detach()[:, cols].t().double()  # (p, E)
        if bias:
            old = torch.cat([old, proj.bias.detach().double()[None]])
        lam = RIDGE * float(gram.diagonal()[: len(cols)].mean().clamp_min(1e-12))
        penalty = torch.ones(size, dtype=torch.float64)
        penalty[len(cols) :] = 0  # the bias is fitted freely
        theta = torch.linalg.solve(gram + lam * torch.diag(penalty), cross + lam * old)
        report[unit] = {
            "before": relative_error(gram, cross, tt, old),
            "after": relative_error(gram, cross, tt, theta),
        }
        logger.info(f"refit {unit[0]} layer {unit[1]}: relative error {report[unit]}")
        if proj not in originals:
            originals[proj] = (
                proj.weight.data.clone(),
                None if proj.bias is None else proj.bias.data.clone(),
            )
        with torch.no_grad():
            proj.weight[:, cols] = theta[: len(cols)].t().to(proj.weight)
            weights[f"{names[proj]}.weight"] = proj.weight.detach().clone()
            if bias:
                proj.bias.copy_(theta[len(cols)].to(proj.bias))
                weights[f"{names[proj]}.bias"] = proj.bias.detach().clone()
    return report, weights
