"""Which heads and neurons to keep under a budget, and their rearrangement within layers.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers"):

- §4.1 mask search: with heads and neurons each sorted by importance (diagonal Fisher), try
  every number of kept heads, fill what the budget leaves with the best neurons, and keep the
  combination whose pruned units have the least importance. Costs here come from the plugin's
  multiply-add model (``macs.mac_terms``), which gives heads and neurons of different layers
  different costs (an encoder neuron runs once per source position, a decoder neuron once per
  step and hypothesis), so units are ranked by importance per multiply-add — Kwon's order
  whenever the costs within heads and within neurons are equal;
- §4.2 mask rearrangement: within each layer, keep the number of kept units but choose which
  ones greedily, minimising the second-order loss estimate ½·1ᵀ F_PP 1 of the pruned set P
  (F: the layer's block of the empirical Fisher).

With ``--search-steps`` S > 1 (:func:`choose`) the budget is reached in S searches at
geometrically shrinking budgets, each among the units the previous one kept and with the
Fisher information recomputed on the model pruned so far, as Michel et al. 2019 ("Are Sixteen
Heads Really Better than One?") recompute head importance while pruning iteratively: units
whose importance depends on others already removed are scored as they now matter.

Every decoder–encoder attention layer keeps at least one head unless ``allow_empty_cross``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.macs import prunable_macs
from fairseq_headprune.posttrain.fisher import fisher
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.sites import DEC_ENC, FFN_SITES, SITES, Unit

logger = logging.getLogger(__name__)

KINDS = ("macs", "heads", "latency")


@dataclass(frozen=True)
class Budget:
    kind: str  # macs | heads | latency
    value: float  # a fraction in (0, 1], or a head count for ``heads``


def parse_budget(value: str) -> Budget:
    """``macs:0.6`` | ``latency:0.6`` (fractions in (0, 1]) | ``heads:K`` (heads kept)."""
    kind, _, number = value.partition(":")
    if kind not in KINDS or not number:
        raise HeadpruneError(f"--budget {value!r}: use macs:F, latency:F (0 < F <= 1) or heads:K")
    try:
        amount = float(number)
    except ValueError:
        raise HeadpruneError(f"--budget {value!r}: {number!r} is not a number") from None
    if kind == "heads":
        if amount != int(amount) or amount < 1:
            raise HeadpruneError(f"--budget {value!r}: K must be a positive whole number of heads")
        return Budget(kind, int(amount))
    if not 0 < amount <= 1:
        raise HeadpruneError(f"--budget {value!r}: the fraction must lie in (0, 1]")
    return Budget(kind, amount)


def _flat(importance: dict[Unit, Tensor], sites, among=None) -> list[tuple[Unit, int, float]]:
    """(unit, index, importance) of every head or neuron of ``sites`` (only those ``among``
    marks, if given)."""
    return [
        (u, j, float(v))
        for u, t in importance.items()
        if u[0] in sites
        for j, v in enumerate(t)
        if among is None or bool(among[u][j])
    ]


def _forced(importance: dict[Unit, Tensor], allow_empty_cross: bool, among=None) -> set:
    """The most important head (of those ``among`` marks) of every decoder–encoder attention
    layer, unless ``allow_empty_cross``."""
    if allow_empty_cross:
        return set()
    forced = set()
    for u, t in importance.items():
        if u[0] == DEC_ENC:
            t = t if among is None else t.masked_fill(~among[u], float("-inf"))
            forced.add((u, int(t.argmax())))
    return forced


def _to_masks(importance: dict[Unit, Tensor], kept: set[tuple[Unit, int]]) -> dict[Unit, Tensor]:
    return {
        u: torch.tensor([(u, j) in kept for j in range(len(t))], dtype=torch.bool)
        for u, t in importance.items()
    }


def search_heads(
    importance: dict[Unit, Tensor], k: int, allow_empty_cross: bool = False, among=None
) -> dict[Unit, Tensor]:
    """Keep the ``k`` most important heads (of those ``among`` marks, if given; all neurons)."""
    heads = _flat(importance, SITES, among)
    forced = _forced(importance, allow_empty_cross, among)
    if not len(forced) <= k <= len(heads):
        raise HeadpruneError(
            f"--budget heads:{k}: the model has {len(heads)} prunable heads and {len(forced)} "
            "decoder–encoder attention layers that keep one each "
            "(see --allow-empty-cross-attention)"
        )
    order = sorted(heads, key=lambda h: ((h[0], h[1]) not in forced, -h[2]))
    kept = {(u, j) for u, j, _ in order[:k]}
    kept |= {(u, j) for u, j, _ in _flat(importance, FFN_SITES, among)}
    return _to_masks(importance, kept)


def search_cost(
    importance: dict[Unit, Tensor],
    cost: dict[Unit, float],
    budget: float,
    allow_empty_cross: bool = False,
    among: dict[Unit, Tensor] | None = None,
) -> dict[Unit, Tensor]:
    """Kwon's search: keep units whose total ``cost`` (per unit of each layer) ≤ ``budget``,
    chosen among those ``among`` marks (every unit if None).

    Raises HeadpruneError when even the heads that must stay do not fit.
    """
    forced = _forced(importance, allow_empty_cross, among)

    def ranked(sites, first=frozenset()):
        units = _flat(importance, sites, among)
        units.sort(key=lambda x: ((x[0], x[1]) not in first, -x[2] / max(cost[x[0]], 1e-12)))
        c = torch.tensor([float(cost[u]) for u, _, _ in units], dtype=torch.float64)
        imp = torch.tensor([v for _, _, v in units], dtype=torch.float64)
        zero = torch.zeros(1, dtype=torch.float64)
        return units, torch.cat([zero, c.cumsum(0)]), torch.cat([zero, imp.cumsum(0)])

    heads, head_cost, head_imp = ranked(SITES, frozenset(forced))
    neurons, neuron_cost, neuron_imp = ranked(FFN_SITES)
    if budget < 0 or head_cost[len(forced)] > budget * (1 + 1e-9):
        raise HeadpruneError(
            "--budget: too small: the units kept whole (--sites) or the one head kept in each "
            "decoder–encoder attention layer (see --allow-empty-cross-attention) cost more"
        )
    best, best_n = None, None
    for n in range(len(forced), len(heads) + 1):
        left = budget - float(head_cost[n])
        if left < -1e-9 * budget:
            break
        k = int(
            torch.searchsorted(
                neuron_cost, torch.tensor([left + 1e-9 * budget], dtype=torch.float64), right=True
            )
        )
        k = max(k - 1, 0)
        kept_importance = float(head_imp[n] + neuron_imp[k])
        if best is None or kept_importance > best[0]:
            best, best_n = (kept_importance, k), n
    kept = {(u, j) for u, j, _ in heads[:best_n]} | {(u, j) for u, j, _ in neurons[: best[1]]}
    return _to_masks(importance, kept)


def pruned_loss(block: Tensor, pruned: Tensor) -> float:
    """½·1ᵀ F_PP 1: the second-order loss estimate of removing the units ``pruned`` (bool)."""
    idx = pruned.nonzero().flatten()
    return 0.5 * float(block[idx][:, idx].sum())


def rearrange(mask: Tensor, block: Tensor) -> Tensor:
    """Kwon §4.2 within one layer: as many units pruned, chosen greedily by ``block``."""
    n_pruned = int((~mask).sum())
    if n_pruned in (0, len(mask)):
        return mask
    pruned = torch.zeros_like(mask)
    col = torch.zeros(len(mask), dtype=block.dtype)  # Σ_{j∈P} F_ij
    diag = block.diagonal()
    for _ in range(n_pruned):
        gain = 2 * col + diag  # increase of 1ᵀF_PP1 when i joins P
        gain[pruned] = float("inf")
        i = int(gain.argmin())
        pruned[i] = True
        col += block[:, i]
    if pruned_loss(block, pruned) < pruned_loss(block, ~mask):
        return ~pruned
    return mask


def rearrange_all(masks: dict[Unit, Tensor], blocks: dict[Unit, Tensor]) -> dict[Unit, Tensor]:
    return {u: rearrange(m, blocks[u]) for u, m in masks.items()}


def step_targets(total: float, target: float, steps: int) -> list[float]:
    """What each of ``steps`` searches keeps, geometric from ``total`` down to ``target``
    (the last exactly ``target``, the others at most ``total``)."""
    ahead = [total ** (1 - s / steps) * target ** (s / steps) for s in range(1, steps)]
    return [min(t, total) for t in ahead] + [target]


def choose(args, task, model, masks: Masks, batches: list[dict], terms: dict) -> tuple:
    """The kept units (search, then rearrangement) and the latency report if any.

    Units of the kinds ``--sites`` leaves out are all kept; their cost comes off the budget.
    With ``--search-steps`` S > 1 the budget is reached in S searches, each among the units
    the previous one kept, with the Fisher information of the model pruned so far.
    """
    budget = parse_budget(args.budget)
    cost, latency, allowed = None, None, 0.0
    if budget.kind == "latency":
        cost, allowed, latency = args.latency_costs
    elif budget.kind == "macs":
        cost = {u: float(c) for u, (c, _) in terms.items()}
        allowed = budget.value * prunable_macs(terms)
    keep = None
    for step, target in enumerate(_targets(args, budget, masks, cost, allowed)):
        diag, blocks = fisher(model, masks, batches, keep)
        searched = {u: t for u, t in diag.items() if u[0] in args.sites}
        fixed = {
            u: torch.ones(len(t), dtype=torch.bool) for u, t in diag.items() if u not in searched
        }
        among = None if keep is None else {u: keep[u] for u in searched}
        if budget.kind == "heads":
            found = search_heads(searched, round(target), args.allow_empty_cross_attention, among)
        else:
            found = search_cost(searched, cost, target, args.allow_empty_cross_attention, among)
        keep = {**found, **fixed}
        logger.info(f"search step {step + 1}: kept {sum(int(k.sum()) for k in keep.values())}")
    if args.rearrange:
        keep = {**keep, **rearrange_all({u: keep[u] for u in searched}, blocks)}
    return keep, latency


def _targets(args, budget, masks: Masks, cost: dict | None, allowed: float) -> list[float]:
    """The kept heads (``heads:K``) or kept cost of the searched units at each search step."""
    searched = [u for u in masks.values if u[0] in args.sites]
    if budget.kind == "heads":
        total = sum(len(masks.values[u]) for u in searched if u[0] in SITES)
        return step_targets(total, budget.value, args.search_steps)
    fixed = sum(cost[u] * len(v) for u, v in masks.values.items() if u not in searched)
    total = sum(cost[u] * len(masks.values[u]) for u in searched)
    if allowed < fixed:  # the kinds left whole cost more: search_cost refuses the budget
        return [allowed - fixed]
    return step_targets(total, allowed - fixed, args.search_steps)
