"""Gate tables per attention type, and the gate-trajectory file: when each gate closed.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019, Fig. 8) show the update at which each Hard
Concrete gate of a pruning run closes. With ``--gate-trajectory-interval N`` the L0 criterion
(``l0_criterion``) appends every head's P(open) and deterministic gate to ``SAVE_DIR/``
``TRAJECTORY_FILE`` every N updates, so that this is known without saving checkpoints along
the way; ``python -m recipes.study.gate_trajectory RUN_DIR`` analyses it.

The format, written by :class:`TrajectoryWriter` and read by :func:`read_records`: one JSON
object per line, ``{"num_updates": U, "sites": {type: {"prob_open": [[p per head] per
layer], "gate": [[g per head] per layer], "open": n, "total": n}}}``, the ``sites`` of
:func:`gate_summary` (``fairseq-headprune gates`` prints the same table for a checkpoint). A
resumed run writes the updates after its checkpoint again: the last line of an update wins.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.hard_concrete import HardConcreteGate
from fairseq_headprune.sites import group_by_site

TRAJECTORY_FILE = "gate_trajectory.jsonl"
# update → (where it was read, e.g. "gate_trajectory.jsonl:3"; {"sites": gate table})
Snapshots = dict[int, tuple[str, dict]]


def stack_by_site(
    gates: Mapping[str, HardConcreteGate], value: Callable[[HardConcreteGate], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Per attention type: ``value(gate)`` of every gated layer, stacked to (layers, heads).

    ``gates`` maps attention names (``encoder.layers.0.self_attn…``) to their gates.
    """
    return {
        site: torch.stack([value(gates[name]) for name in names])
        for site, names in group_by_site(gates).items()
    }


def gate_summary(gates: Mapping[str, HardConcreteGate]) -> dict:
    """Per attention type: P(open) and deterministic gate (layers × heads), open counts.

    ``gates`` maps attention names (``encoder.layers.0.self_attn…``) to their gates, as
    ``gated_attention.gates_by_name`` or ``checkpoint_io.gates_from_state`` give them. Layers
    may have different numbers of heads (a pruned model fine-tuned with gates).
    """
    table: dict = {"sites": {}, "open": 0, "total": 0}
    with torch.no_grad():
        for site, names in group_by_site(gates).items():
            layers = [gates[name] for name in names]
            prob = [g.prob_open().tolist() for g in layers]
            det = [g.deterministic().tolist() for g in layers]
            n_open = sum(v > 0 for layer in det for v in layer)
            total = sum(len(layer) for layer in det)
            table["sites"][site] = {"prob_open": prob, "gate": det, "open": n_open, "total": total}
            table["open"] += n_open
            table["total"] += total
    return table


class TrajectoryWriter:
    """Appends the gates to ``save_dir/TRAJECTORY_FILE`` every ``interval`` updates (0: off)."""

    def __init__(self, interval: int, save_dir: str | None) -> None:
        if interval < 0:
            raise HeadpruneError(f"--gate-trajectory-interval must be >= 0, got {interval}")
        if interval and not save_dir:
            raise HeadpruneError("--gate-trajectory-interval needs a --save-dir to write to")
        self.interval = int(interval)
        self.path = Path(save_dir) / TRAJECTORY_FILE if interval else None
        self._recorded_update = -1

    def record(self, updates: int, gates: Callable[[], Mapping[str, HardConcreteGate]]) -> None:
        """At every N-th update (once, on rank 0), append the table of ``gates()``.

        Called in training forward passes, where ``updates`` is the number of updates done.
        """
        if not self.interval or updates % self.interval or updates == self._recorded_update:
            return
        self._recorded_update = updates
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        line = json.dumps({"num_updates": updates, "sites": gate_summary(gates())["sites"]})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def read_records(path: Path) -> Snapshots:
    """update → (``file:line``, gate table) of a trajectory file; the last line of an update
    wins. Raises ``HeadpruneError`` naming the line that is not a gate record."""
    snapshots = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            snapshots[int(record["num_updates"])] = (f"{path.name}:{i}", {"sites": record["sites"]})
        except (ValueError, KeyError) as e:
            raise HeadpruneError(f"{path} line {i} is not a gate record: {e}") from e
    return snapshots
