"""Do a run's gates decide which heads to keep? The check ``fairseq-headprune export`` makes.

The Hard Concrete gates of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, section 6) are
folded into ``out_proj`` at export, so the exported model equals the gated model in evaluation
exactly when the heads it removes have deterministic gate 0. A run's gates decide the heads:

- without a budget, when every deterministic gate is 0 (removed) or at least ``OPEN_GATE``
  (kept): a head scaled by less than half is neither;
- for the attention types a ``--target-heads`` budget covers, when the K heads of highest
  P(open) (``budget.topk_open_mask``) are separated from the others by at least ``MARGIN``
  in P(open), and the deterministic gates keep exactly those K (else keeping them would
  change the model: an open head removed, or a closed head opened).

:func:`check_decided` raises ``HeadpruneError`` naming the undecided gates; export's
``--force-budget`` or a ``--mask`` makes the choice explicit instead. :func:`folding_changes`
measures how far an export is from the gated model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fairseq_headprune import budget
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.gate_trajectory import stack_by_site
from fairseq_headprune.hard_concrete import HardConcreteGate
from fairseq_headprune.sites import group_by_site

# A kept head's deterministic gate, without a budget, is at least this.
OPEN_GATE = 0.5
# The K kept heads' P(open) exceed every removed head's by at least this.
MARGIN = 0.5
# Undecided gates named in the error message (then "and N more").
_SHOWN = 6


def by_site(gates: Mapping[str, HardConcreteGate]) -> dict[str, list[str]]:
    """Attention type → its gated attention prefixes in layer order."""
    return group_by_site(gates)


def _stack(gates: Mapping[str, HardConcreteGate], value) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return stack_by_site(gates, value)


def _name(site: str, layer: int, head: int) -> str:
    return f"{site} {layer}.{head}"


def budget_masks(gates: Mapping[str, HardConcreteGate], spec: str) -> dict[str, torch.Tensor]:
    """Per budgeted attention type, the top-K mask (layers × heads) of ``--target-heads``."""
    sites = by_site(gates)
    targets = budget.parse_target_heads(spec, list(sites))
    mask = budget.topk_open_mask(_stack(gates, HardConcreteGate.prob_open), targets)
    covered = list(sites) if budget.TOTAL in targets else list(targets)
    return {s: mask[s] for s in covered}


def undecided(gates: Mapping[str, HardConcreteGate], spec: str | None) -> list[str]:
    """Descriptions of the gates that do not decide their head (empty: all decided)."""
    sites = by_site(gates)
    det = _stack(gates, HardConcreteGate.deterministic)
    prob = _stack(gates, HardConcreteGate.prob_open)
    masks = budget_masks(gates, spec) if spec else {}
    problems = []
    for site in sites:
        if site in masks:
            continue
        for i, h in torch.nonzero((det[site] > 0) & (det[site] < OPEN_GATE)).tolist():
            problems.append(f"{_name(site, i, h)} gate {det[site][i, h]:.2f}")
    if masks:
        kept = torch.cat([prob[s][m] for s, m in masks.items()])
        removed = torch.cat([prob[s][~m] for s, m in masks.items()])
        if kept.numel() and removed.numel() and kept.min() - removed.max() < MARGIN:
            problems.append(
                f"P(open) of the kept heads down to {kept.min():.3f}, of the removed heads up "
                f"to {removed.max():.3f} (a margin of {MARGIN} needed)"
            )
        for s, m in masks.items():
            for i, h in torch.nonzero(m != (det[s] > 0)).tolist():
                what = "kept" if m[i, h] else "removed"
                problems.append(f"{_name(s, i, h)} {what} but gate {det[s][i, h]:.2f}")
    return problems


def check_decided(gates: Mapping[str, HardConcreteGate], spec: str | None) -> None:
    """Raise ``HeadpruneError`` in one line when the gates do not decide the heads to keep."""
    problems = undecided(gates, spec)
    if not problems:
        return
    more = f", and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    under = f" under the run's --target-heads {spec}" if spec else ""
    listed = "; ".join(problems[:_SHOWN])
    raise HeadpruneError(
        f"the gates{under} do not decide which heads to keep: {listed}{more}. "
        "Train longer, or pass --force-budget (keep the heads export would choose) or a --mask"
    )


def folding_changes(
    det: Mapping[str, torch.Tensor], folded: Mapping[str, torch.Tensor], kept: Mapping[str, list]
) -> tuple[float, float]:
    """(largest |folded − deterministic| of a kept head, largest deterministic gate removed).

    Both 0 ⇔ the exported model equals the gated model in evaluation. ``det``/``folded``:
    attention prefix → gate per head; ``kept``: prefix → positions of the heads kept.
    """
    change, removed = 0.0, 0.0
    for prefix, gate in det.items():
        keep = torch.zeros_like(gate, dtype=torch.bool)
        keep[kept.get(prefix, list(range(gate.numel())))] = True
        if keep.any():
            change = max(change, (folded[prefix] - gate)[keep].abs().max().item())
        if (~keep).any():
            removed = max(removed, gate[~keep].max().item())
    return change, removed
