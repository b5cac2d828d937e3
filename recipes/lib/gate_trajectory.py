"""The update at which each head's gate closed during a pruning run.

    python recipes/lib/gate_trajectory.py PRUNE_DIR [--json OUT.json]

Voita et al. 2019 (Fig. 8) show when each gate of a pruning run closes. ``recipes/prune.sh``
passes ``--gate-trajectory-interval`` to the L0 criterion, which appends the gates to
``PRUNE_DIR/gate_trajectory.jsonl`` every N updates; that file is read when it exists.
Runs without it can save checkpoints along the way instead:

    EXTRA_ARGS="--save-interval-updates 100 --keep-interval-updates -1 --no-save-optimizer-state" \\
      bash recipes/prune.sh

(fairseq writes ``checkpoint_<epoch>_<updates>.pt`` every 100 updates, and validates there
too, which costs time; ``--no-save-optimizer-state`` keeps them small); then every
``checkpoint*.pt`` of PRUNE_DIR is read, ordered by its update count; ``checkpoint_best.pt``
is left out (it repeats an earlier state). A head "closed at" update U when its deterministic
gate is 0 in the snapshot of update U and in every later one; ``closed_after`` is the
update of the snapshot before (the gate closed between the two). Printed as a table per
attention type; ``--json`` also writes P(open) and the gate of every head per snapshot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fairseq_headprune.checkpoint_io import load_checkpoint
from fairseq_headprune.l0_criterion import TRAJECTORY_FILE


def num_updates(state: dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def snapshots_from_log(path: Path) -> dict[int, tuple[str, dict]]:
    """update → (source, gate table) from the criterion's gate_trajectory.jsonl.

    A resumed run writes the updates after its checkpoint again: the last line wins.
    """
    snapshots = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            snapshots[int(record["num_updates"])] = (f"{path.name}:{i}", {"sites": record["sites"]})
        except (ValueError, KeyError) as e:
            raise SystemExit(f"error: {path} line {i} is not a gate record: {e}") from e
    return snapshots


def snapshots_from_checkpoints(run: Path) -> dict[int, tuple[str, dict]]:
    """update → (file, gate table) from every checkpoint*.pt of a run but checkpoint_best.pt."""
    from fairseq_headprune.cli import gate_table

    snapshots = {}
    for path in sorted(run.glob("checkpoint*.pt")):
        if path.name == "checkpoint_best.pt":
            continue
        state = load_checkpoint(path)
        table = gate_table(state)
        if not table["sites"]:
            raise SystemExit(f"error: {path} has no head gates (not a pruning run)")
        snapshots.setdefault(num_updates(state), (path.name, table))  # duplicates: same state
    return snapshots


def trajectory(run: Path) -> dict:
    log = run / TRAJECTORY_FILE
    snapshots = snapshots_from_log(log) if log.exists() else snapshots_from_checkpoints(run)
    if not snapshots:
        raise SystemExit(f"error: neither {TRAJECTORY_FILE} nor checkpoint*.pt in {run}")
    updates = sorted(snapshots)
    closed: dict[str, list[list[dict | None]]] = {}
    for site, first in snapshots[updates[0]][1]["sites"].items():
        rows = []
        for layer, gates in enumerate(first["gate"]):
            row = []
            for head in range(len(gates)):
                series = [snapshots[u][1]["sites"][site]["gate"][layer][head] for u in updates]
                i = len(series)
                while i > 0 and series[i - 1] == 0:
                    i -= 1
                if i == len(series):
                    row.append(None)  # open at the end
                else:
                    row.append(
                        {"closed_at": updates[i], "closed_after": updates[i - 1] if i else None}
                    )
            rows.append(row)
        closed[site] = rows
    return {
        "run": str(run),
        "updates": updates,
        "snapshots": {u: {"file": snapshots[u][0], **snapshots[u][1]} for u in updates},
        "closed": closed,
    }


def format_closed(result: dict) -> str:
    lines = [f"{len(result['updates'])} snapshots, updates {result['updates']}"]
    for site, rows in result["closed"].items():
        lines.append(f"{site}: update at which each gate closed ('-': open at the end)")
        lines.append("layer " + "".join(f"{'head ' + str(h):>9}" for h in range(len(rows[0]))))
        for i, row in enumerate(rows):
            cells = ["-" if c is None else str(c["closed_at"]) for c in row]
            lines.append(f"{i:>5} " + "".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a pruning run's save dir (prune.sh's PRUNE_DIR)")
    p.add_argument("--json", type=Path, help="also write every snapshot's gates here")
    args = p.parse_args(argv)
    result = trajectory(args.run)
    print(format_closed(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
