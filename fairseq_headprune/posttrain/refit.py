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


def select(gram: Tensor, rhs: Tensor, groups: Tensor, k: int) -> Tensor:
    """Which ``k`` of the column ``groups`` (G, d) to keep: greedy backward elimination for the
    quadratic θᵀGθ − 2θᵀR (Optimal Brain Surgeon, grouped as in Frantar & Alistarh 2022):
    remove the group S whose removal, every other weight re-fitted, costs least,
    tr(θ_Sᵀ [G⁻¹]_SS⁻¹ θ_S), then update θ and G⁻¹ as that removal does. Returns the kept
    groups' indices, ascending."""
    inv = torch.linalg.inv(gram)
    theta = inv @ rhs
    alive = torch.ones(len(groups), dtype=torch.bool)
    for _ in range(len(groups) - k):
        idx = groups[alive]  # (A, d)
        blocks = torch.linalg.inv(inv[idx[:, :, None], idx[:, None, :]])  # (A, d, d)
        t = theta[idx]  # (A, d, E)
        costs = torch.einsum("ade,adf,afe->a", t, blocks, t)
        drop = int(alive.nonzero().flatten()[int(costs.argmin())])
        s = groups[drop]
        step = inv[:, s] @ torch.linalg.inv(inv[s][:, s])
        theta -= step @ theta[s]
        inv -= step @ inv[s]
        alive[drop] = False
    return alive.nonzero().flatten()


def ridge(gram: Tensor, cross: Tensor, old: Tensor, p: int) -> tuple[Tensor, Tensor]:
    """The normal equations of the ridge fit towards the ``old`` weights: λ = RIDGE × the mean
    of the first ``p`` (weight) diagonal entries; the rows after them (the bias) are free."""
    lam = RIDGE * float(gram.diagonal()[:p].mean().clamp_min(1e-12))
    penalty = torch.zeros(len(gram), dtype=gram.dtype)
    penalty[:p] = lam
    return gram + torch.diag(penalty), cross + penalty[:, None] * old


def _system(model, masks: Masks, unit: Unit, batches: list[dict], units: Tensor, originals):
    """(XᵀX, XᵀT, ‖T‖², the original weights (p[+1], E)) of the layer's least-squares problem:
    X the ``units``' inputs to the projection (and ones for its bias), T the targets."""
    proj, owner = unit_modules(model, unit)
    bias = proj.bias is not None
    cols = columns(unit, units, 1 if unit[0] in FFN_SITES else owner.head_dim)
    pad = model.decoder.dictionary.pad()
    size = len(cols) + int(bias)
    gram = torch.zeros(size, size, dtype=torch.float64)
    cross = torch.zeros(size, proj.out_features, dtype=torch.float64)
    tt = 0.0
    for batch in batches:
        got, real, t = residual_target(
            model, masks, unit, batch, pad, lambda: original_weights(originals)
        )
        a = features(masks, unit, got, units, real, bias)
        gram += a.t() @ a
        cross += a.t() @ t
        tt += float((t * t).sum())
    old = proj.weight.detach()[:, cols].t().double()
    if bias:
        old = torch.cat([old, proj.bias.detach().double()[None]])
    return gram, cross, tt, old


def refit(
    model: nn.Module, masks: Masks, batches: list[dict], reselect: bool = False
) -> tuple[dict, dict[str, Tensor]]:
    """Refit every layer in :func:`tuning.tuning_order` in place; return each layer's relative
    reconstruction error before (the search's units, original weights) and after, and the new
    weights by parameter name (the kept units' columns in place, the others untouched).

    ``reselect``: keep as many units in each layer as the search did, but choose which ones
    by :func:`select` on the layer's least-squares problem over all its units."""
    names = {m: n for n, m in model.named_modules()}
    originals: dict[nn.Linear, tuple[Tensor, Tensor | None]] = {}
    report, weights = {}, {}
    for unit in tuning_order(model):
        if unit not in masks.values or not bool((masks.values[unit] != 0).any()):
            continue
        searched = masks.values[unit] != 0
        proj, owner = unit_modules(model, unit)
        head_dim = 1 if unit[0] in FFN_SITES else owner.head_dim
        every = reselect and not bool(searched.all())
        if every:  # all units' inputs: the layer's own masks change neither them nor its target
            masks.set({unit: torch.ones(len(searched))})
        units = torch.arange(len(searched)) if every else searched.nonzero().flatten()
        gram, cross, tt, old = _system(model, masks, unit, batches, units, originals)
        p = len(units) * head_dim
        bias_row = torch.arange(p, len(gram))  # row p if the projection has a bias
        chosen = searched
        if every:
            groups = torch.arange(p).view(-1, head_dim)
            chosen = torch.zeros_like(searched)
            chosen[select(*ridge(gram, cross, old, p), groups, int(searched.sum()))] = True
            masks.set({unit: chosen.float()})
        # the system's rows of the units the search kept (b) and of those kept now (r)
        b, r = (
            torch.cat([columns(unit, m[units].nonzero().flatten(), head_dim), bias_row])
            for m in (searched, chosen)
        )
        theta = torch.linalg.solve(*ridge(gram[r][:, r], cross[r], old[r], len(r) - len(bias_row)))
        report[unit] = {
            "before": relative_error(gram[b][:, b], cross[b], tt, old[b]),
            "after": relative_error(gram[r][:, r], cross[r], tt, theta),
        }
        logger.info(f"refit {unit[0]} layer {unit[1]}: relative error {report[unit]}")
        if proj not in originals:
            originals[proj] = (
                proj.weight.data.clone(),
                None if proj.bias is None else proj.bias.data.clone(),
            )
        cols = columns(unit, chosen.nonzero().flatten(), head_dim)
        with torch.no_grad():
            proj.weight[:, cols] = theta[: len(cols)].t().to(proj.weight)
            weights[f"{names[proj]}.weight"] = proj.weight.detach().clone()
            if proj.bias is not None:
                proj.bias.copy_(theta[len(cols)].to(proj.bias))
                weights[f"{names[proj]}.bias"] = proj.bias.detach().clone()
    return report, weights
