"""The update at which each head's gate closed during a pruning run.

    python -m recipes.study.gate_trajectory PRUNE_DIR [--json OUT.json]

Voita et al. 2019 (Fig. 8) show when each gate of a pruning run closes. ``recipes/prune.sh``
passes ``--gate-trajectory-interval`` to the L0 criterion, which appends the gates to
``PRUNE_DIR/gate_trajectory.jsonl`` every N updates; that file is read when it exists,
with ``checkpoint_last.pt`` as the last snapshot when it is later than the last record (the
end of training seldom falls on a multiple of N), so "open at the end" is the final model's
state. Runs without it can save checkpoints along the way instead:

    EXTRA_ARGS="--save-interval-updates 100 --keep-interval-updates -1 --no-save-optimizer-state" \\
      bash recipes/prune.sh

(fairseq writes ``checkpoint_<epoch>_<updates>.pt`` every 100 updates, and validates there
too, which costs time; ``--no-save-optimizer-state`` keeps them small); then every
``checkpoint*.pt`` of PRUNE_DIR is read, ordered by its update count; ``checkpoint_best.pt``
is left out (it repeats an earlier state). A head "closed at" update U when its deterministic
gate is 0 in the snapshot of update U and in every later one; ``closed_after`` is the
update of the snapshot before (the gate closed between the two). Printed as a table per
attention type; ``--json`` also writes P(open) and the gate of every head per snapshot.

With ``--scores heads.json`` (``fairseq-headprune score`` of the model before pruning), it
also prints Spearman's rank correlation between each head's score (``--metrics``, default
LRP relevance, confidence and the positional fraction) and the update at which its gate
closed: Voita et al. find that the heads pruned last are the most relevant and confident
ones, and the specialised (positional, syntactic) ones. Heads that closed between the same
two snapshots are ordered by their P(open) in the snapshot before (the lower, the earlier).

The trajectory format (one JSON line per snapshot, the tables of ``gate_summary``) has one
home, ``fairseq_headprune/gate_trajectory.py``, with its writer (used by the L0 criterion) and
its reader (:func:`read_records`, used here).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fairseq_headprune.checkpoint_io import load_checkpoint
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.gate_trajectory import TRAJECTORY_FILE, read_records

# heads.json fields correlated with the closing update by default (``--metrics``, the report)
CLOSING_METRICS = ("lrp", "confidence", "positional_fraction")
# what Spearman's ρ ranks: scores, and closing orders (update, P(open) before closing)
Rankable = float | tuple[float, ...]


def num_updates(state: dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def snapshots_from_log(path: Path) -> dict[int, tuple[str, dict]]:
    """update → (source, gate table) from the criterion's gate_trajectory.jsonl.

    A resumed run writes the updates after its checkpoint again: the last line wins.
    """
    try:
        return read_records(path)
    except HeadpruneError as e:
        raise SystemExit(f"error: {e}") from e


def checkpoint_snapshot(path: Path) -> tuple[int, dict]:
    """(update, gate table) of one checkpoint of a pruning run."""
    from fairseq_headprune.cli import gate_table

    state = load_checkpoint(path)
    table = gate_table(state)
    if not table["sites"]:
        raise SystemExit(f"error: {path} has no head gates (not a pruning run)")
    return num_updates(state), table


def snapshots_from_checkpoints(run: Path) -> dict[int, tuple[str, dict]]:
    """update → (file, gate table) from every checkpoint*.pt of a run but checkpoint_best.pt."""
    snapshots = {}
    for path in sorted(run.glob("checkpoint*.pt")):
        if path.name == "checkpoint_best.pt":
            continue
        updates, table = checkpoint_snapshot(path)
        snapshots.setdefault(updates, (path.name, table))  # duplicates: same state
    return snapshots


def final_snapshot(run: Path, after: int) -> dict[int, tuple[str, dict]]:
    """checkpoint_last.pt's gates when it is later than update ``after``, else nothing."""
    path = run / "checkpoint_last.pt"
    if not path.exists():
        return {}
    updates, table = checkpoint_snapshot(path)
    return {updates: (path.name, table)} if updates > after else {}


def trajectory(run: Path) -> dict:
    log = run / TRAJECTORY_FILE
    if log.exists():
        snapshots = snapshots_from_log(log)
        if snapshots:
            snapshots.update(final_snapshot(run, max(snapshots)))
    else:
        snapshots = snapshots_from_checkpoints(run)
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
                    before = snapshots[updates[i - 1]][1]["sites"][site] if i else {}
                    prob = before.get("prob_open")
                    row.append({
                        "closed_at": updates[i], "closed_after": updates[i - 1] if i else None,
                        "prob_before": prob[layer][head] if prob else None,
                    })  # fmt: skip
            rows.append(row)
        closed[site] = rows
    return {
        "run": str(run),
        "updates": updates,
        "snapshots": {u: {"file": snapshots[u][0], **snapshots[u][1]} for u in updates},
        "closed": closed,
    }


def average_ranks(values: list[Rankable]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank (as Spearman's ρ needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[Rankable], y: list[Rankable]) -> float | None:
    """Spearman's rank correlation (Pearson's r of the average ranks); None if undefined."""
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else None


def closing_order(cell: dict) -> tuple[float, float]:
    """A closed gate's place in the order of closing: its closing update, then its P(open) in
    the snapshot before (unknown: 0, the earliest of its snapshot)."""
    prob = cell.get("prob_before")
    return (float(cell["closed_at"]), 0.0 if prob is None else float(prob))


def closing_correlations(result: dict, scores: dict, metrics: list[str]) -> dict:
    """Spearman's ρ between each head's score (heads.json) and the update its gate closed.

    Heads still open at the end count as closing after the last snapshot (tied last), so a
    positive ρ means: the higher the score, the later the gate closed (Voita et al. §6).
    Heads that closed between the same two snapshots (an exact head budget closes most of
    them in one burst as its warm-up ends) are ordered by their P(open) in the snapshot
    before: the lower, the further on its way to closing. ``rho_by_layer``: the same within
    each layer, which a layer-wide trend (deeper layers closing first, say) cannot produce.
    """
    last = (result["updates"][-1] + 1, 1.0)
    by_key = {(h["site"], h["layer"], h["head"]): h for h in scores["heads"]}
    out = {}
    for metric in metrics:
        xs, ys, by_layer = [], [], {}
        for site, rows in result["closed"].items():
            for layer, row in enumerate(rows):
                lx, ly = [], []
                for head, cell in enumerate(row):
                    record = by_key.get((site, layer, head))
                    if record is None or record.get(metric) is None:
                        continue
                    lx.append(float(record[metric]))
                    ly.append(last if cell is None else closing_order(cell))
                xs, ys = xs + lx, ys + ly
                by_layer[f"{site} {layer}"] = spearman(lx, ly) if len(lx) > 1 else None
        out[metric] = {
            "rho": spearman(xs, ys) if len(xs) > 1 else None,
            "heads": len(xs),
            "rho_by_layer": by_layer,
        }
    return out


def format_closed(result: dict) -> str:
    updates = result["updates"]
    lines = [f"{len(updates)} snapshots, updates {updates[0]}..{updates[-1]}"]
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
    p.add_argument(
        "--scores",
        type=Path,
        help="heads.json of `fairseq-headprune score` on the model before pruning: "
        "print Spearman's ρ between each --metrics score and the closing update",
    )
    p.add_argument("--metrics", default=",".join(CLOSING_METRICS),
                   help="heads.json fields to correlate with the closing update")  # fmt: skip
    args = p.parse_args(argv)
    result = trajectory(args.run)
    print(format_closed(result))
    if args.scores:
        scores = json.loads(args.scores.read_text())
        result["correlations"] = closing_correlations(result, scores, args.metrics.split(","))
        for metric, c in result["correlations"].items():
            rho = "undefined" if c["rho"] is None else f"{c['rho']:+.3f}"
            print(f"Spearman ρ({metric}, closing update) = {rho} over {c['heads']} heads")
            layers = ", ".join(
                f"{k}: {'–' if v is None else f'{v:+.2f}'}" for k, v in c["rho_by_layer"].items()
            )
            print(f"  within layers: {layers}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
