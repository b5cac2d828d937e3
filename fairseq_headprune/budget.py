"""An exact head budget: drive the expected number of open heads to K, keep exactly K at export.

Instead of sweeping the L0 weight λ of Voita et al. 2019 ("Analyzing Multi-Head
Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019)
until a run happens to keep the wanted number of heads, the expected number of open heads
ŝ = Σ_h P(g_h ≠ 0) is constrained to a target t with the Lagrangian term of Wang, Wohlwend &
Lei 2020 ("Structured Pruning of Large Language Models", EMNLP 2020, section 3), also used by
Xia, Zhong & Chen 2022 (CoFi, "Structured Pruning Learns Compact and Accurate Models", ACL
2022, ``models/l0_module.py``)::

    L_budget = λ₁ · (ŝ − t) + λ₂ · (ŝ − t)²

The model minimises it while the multipliers λ₁, λ₂ maximise it (gradient ascent):
∂L/∂λ₁ = ŝ − t, so λ₁ rises while too many heads are open (which pushes P(open) down) and
falls, below zero, while too few are (which pushes P(open) up); ∂L/∂λ₂ = (ŝ − t)² ≥ 0, so λ₂
only grows and makes any deviation ever more costly. :func:`gradient_ascent` flips the
gradient sign so that a single optimiser, descending on everything, ascends on λ.

The target is ramped linearly (:func:`ramped_target`) from the number of gated heads at the
start to K over a warm-up, as in both papers, so that the model is not asked to drop every
unwanted head on the first update.

The constraint holds in expectation only: in a model whose heads matter alike, ŝ = K is met
by every head at P(open) = K/n just as well as by K heads at 1 and the rest at 0, and the
deterministic gates then keep all of them. After the warm-up, :func:`rounding_term` (this
project's addition, not in the papers) opens the current top K further and closes the rest,
so that the deterministic gates keep exactly K heads. :func:`topk_open_mask` gives the K heads
with the highest P(open), CoFi's rule for its deterministic masks; export keeps them when
they are clearly the most open and the deterministic gates agree (``gate_decision``), or
when told to (``--force-budget``).

A budget (``--target-heads``) is either a total over all gated heads (``"10"``) or one per
attention type (``"enc-self:10,dec-enc:20"``). This module is pure torch: no fairseq import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.hard_concrete import scale_gradient

FLAG = "--target-heads"
# The key of a budget over all gated heads together.
TOTAL = "total"


def parse_target_heads(spec: str, sites: Sequence[str]) -> dict[str, int]:
    """``"10"`` → ``{"total": 10}``; ``"enc-self:10,dec-enc:20"`` → one budget per type.

    Per-type budgets come back in the order of ``sites``. Raises ``HeadpruneError`` naming the
    flag for an unknown type, a repeated type, a negative or non-integer count, or a total
    mixed with per-type budgets.
    """
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise HeadpruneError(f"{FLAG}: empty budget {spec!r}; give K or TYPE:K[,TYPE:K...]")
    targets: dict[str, int] = {}
    for item in items:
        name, sep, count = item.rpartition(":")
        name = name.strip() if sep else TOTAL
        if sep and name not in sites:
            raise HeadpruneError(
                f"{FLAG}: unknown attention type {name!r}; choose from {list(sites)}"
            )
        if name in targets:
            what = "a total" if name == TOTAL else f"{name!r}"
            raise HeadpruneError(f"{FLAG}: {what} is given more than once in {spec!r}")
        try:
            k = int(count.strip())
        except ValueError:
            raise HeadpruneError(
                f"{FLAG}: {count.strip()!r} is not a whole number of heads"
            ) from None
        if k < 0:
            raise HeadpruneError(f"{FLAG}: the number of heads must be >= 0, got {k} in {item!r}")
        targets[name] = k
    if TOTAL in targets and len(targets) > 1:
        raise HeadpruneError(
            f"{FLAG}: give either one total (K) or per-type budgets (TYPE:K,...), "
            f"not both: {spec!r}"
        )
    if TOTAL in targets:
        return targets
    return {s: targets[s] for s in sites if s in targets}


def heads_in(heads_per_site: Mapping[str, int], name: str) -> int:
    """Gated heads a budget covers: one attention type, or all of them for ``total``."""
    return sum(heads_per_site.values()) if name == TOTAL else heads_per_site.get(name, 0)


def check_targets(targets: Mapping[str, int], heads_per_site: Mapping[str, int]) -> None:
    """Raise ``HeadpruneError`` naming the flag for a budget the gated model cannot meet.

    ``heads_per_site``: number of gated heads per attention type of the model.
    """
    for name, k in targets.items():
        if name != TOTAL and heads_per_site.get(name, 0) == 0:
            gated = ",".join(heads_per_site) or "none"
            raise HeadpruneError(
                f"{FLAG}: a budget for {name}, but its heads have no gate (--head-gates {gated})"
            )
        n = heads_in(heads_per_site, name)
        if k > n:
            raise HeadpruneError(
                f"{FLAG}: {k} heads wanted for {name}, but it has only {n} gated heads"
            )


def expected_open(prob_open: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """ŝ per budget (differentiable): Σ P(open) over the heads each budget covers. → (C,)"""
    sums = {site: p.sum() for site, p in prob_open.items()}
    return torch.stack([sum(sums.values()) if n == TOTAL else sums[n] for n in names])


def ramped_target(
    start: torch.Tensor, target: torch.Tensor, num_updates: int, warmup_updates: int
) -> torch.Tensor:
    """Linear ramp from ``start`` (update 0) to ``target`` (update ``warmup_updates`` on)."""
    if warmup_updates <= 0:
        return target.clone()
    frac = min(max(num_updates, 0) / warmup_updates, 1.0)
    return start + (target - start) * frac


def lagrangian_term(
    expected: torch.Tensor, target: torch.Tensor, lambda_1: torch.Tensor, lambda_2: torch.Tensor
) -> torch.Tensor:
    """Σ_c λ₁_c (ŝ_c − t_c) + λ₂_c (ŝ_c − t_c)²: a scalar; all arguments have shape (C,)."""
    gap = expected - target  # (C,)
    return (lambda_1 * gap + lambda_2 * gap * gap).sum()


def rounding_term(
    prob_open: Mapping[str, torch.Tensor], targets: Mapping[str, int]
) -> torch.Tensor:
    """Σ P(open) of the heads outside the current top K − Σ P(open) of the top K.

    Minimising it opens the K heads of highest P(open) further and closes the others: the
    expected count ŝ = K becomes K heads surely open, so the deterministic gates keep
    exactly :func:`topk_open_mask`'s heads. Only meaningful once the ranking is (after the
    warm-up); a scalar, differentiable in every covered P(open).
    """
    keep = topk_open_mask(prob_open, targets)
    covered = list(prob_open) if TOTAL in targets else list(targets)
    terms = [torch.where(keep[s], -prob_open[s], prob_open[s]).sum() for s in covered]
    return torch.stack(terms).sum()


def gradient_ascent(multiplier: torch.Tensor) -> torch.Tensor:
    """``multiplier`` in the forward pass; its gradient arrives negated (so descent ascends)
    and × ``hard_concrete.GRAD_SCALE``, like the gates', so that the multipliers (gradient
    ŝ − t, which can be tens of heads) do not set fairseq's global ``--clip-norm``.

    A tensor hook on a fresh copy, not on the parameter itself: it holds whatever the
    parameter object becomes (``.to()``, ``.half()``, a DDP wrapper) and needs no removal.
    """
    out = multiplier.clone()
    if out.requires_grad:
        out.register_hook(_ascent)
    return out


def _ascent(grad: torch.Tensor) -> torch.Tensor:
    return -scale_gradient(grad)


def topk_open_mask(
    prob_open: Mapping[str, torch.Tensor], targets: Mapping[str, int]
) -> dict[str, torch.Tensor]:
    """Keep exactly K heads: the ones with the highest P(open), per type or in total.

    ``prob_open``: per attention type, P(open) of shape (layers, heads). ``targets``: the
    output of :func:`parse_target_heads`. Returns per attention type a bool tensor of the
    same shape, True for a kept head. Types without a budget keep every head (only possible
    with per-type budgets). Ties go to the earlier type, layer and head.
    """
    check_targets(targets, {s: p.numel() for s, p in prob_open.items()})
    mask = {s: torch.ones_like(p, dtype=torch.bool) for s, p in prob_open.items()}
    groups = [(TOTAL, list(prob_open))] if TOTAL in targets else [(s, [s]) for s in targets]
    for name, sites in groups:
        flat = torch.cat([prob_open[s].detach().reshape(-1).float() for s in sites])  # (N,)
        order = torch.sort(flat, descending=True, stable=True).indices
        keep = torch.zeros_like(flat, dtype=torch.bool)
        keep[order[: targets[name]]] = True
        offset = 0
        for s in sites:
            n = prob_open[s].numel()
            mask[s] = keep[offset : offset + n].reshape(prob_open[s].shape)
            offset += n
    return mask
