"""How far a model trained from scratch got: validation nll per epoch from fairseq-train logs.

Voita et al. 2019 compare pruning with training the small model anew; that comparison is only
fair when the model trained from scratch converged, which its validation curve shows.
"""

from __future__ import annotations

import re
from pathlib import Path


def read_logs(logs: Path | list[Path]) -> str:
    """One run's log text: a file, or the files of a resumed run, in order."""
    return "\n".join(
        f.read_text(errors="replace") for f in ([logs] if isinstance(logs, Path) else logs)
    )


def validation_curve(log: Path | list[Path]) -> list[tuple[int, int, float]]:
    """(epoch, updates, valid nll) per epoch from a fairseq-train log (``--log-format
    simple``); a resumed run's log repeats epochs: the last line of an epoch counts."""
    per_epoch: dict[int, tuple[int, int, float]] = {}
    for line in read_logs(log).splitlines():
        if "| valid on 'valid' subset |" not in line:
            continue
        fields = dict(f.split(" ", 1) for f in line.split("| ")[1:] if " " in f.strip())
        try:
            epoch = int(fields["epoch"].split()[0])
            point = (epoch, int(fields["num_updates"]), float(fields["nll_loss"]))
        except (KeyError, ValueError):
            continue
        per_epoch[epoch] = point
    return [per_epoch[e] for e in sorted(per_epoch)]


def best_epoch(
    log: Path | list[Path], curve: list[tuple[int, int, float]]
) -> tuple[int, int, float]:
    """The epoch whose checkpoint is ``checkpoint_best.pt``: the last one the log says it saved
    there. Without such a line, the lowest printed nll, the later epoch on a tie (fairseq
    keeps a new best when it is lower or equal; the printed nll is rounded to 3 digits)."""
    saved = re.findall(r"Saved checkpoint \S*checkpoint_best\.pt \(epoch (\d+)", read_logs(log))
    by_epoch = {c[0]: c for c in curve}
    if saved and int(saved[-1]) in by_epoch:
        return by_epoch[int(saved[-1])]
    return min(curve, key=lambda c: (c[2], -c[0]))


def training_markdown(rows: list[dict], last: int = 5) -> list[str]:
    """How far the models trained from scratch (the baseline, the scratch controls) got:
    the validation nll of their last epochs, read from ``train.log`` next to the checkpoint
    or, where that is not on this machine, from model.json's ``train_log``. A curve still
    falling at the end means the model is not converged."""
    lines = []
    for r in rows:
        if r["method"] not in ("baseline", "scratch"):
            continue
        log = Path(r["checkpoint"]).parent / "train.log" if r.get("checkpoint") else None
        # the run folder gone: the committed logs, all of them or none
        logs = [log] if log and log.is_file() else [Path(f) for f in r.get("train_log", [])]
        curve = validation_curve(logs) if logs and all(f.is_file() for f in logs) else []
        if not curve:
            continue
        best = best_epoch(logs, curve)
        tail = curve[-last:]
        lines.append(
            f"| {r['name']} | {curve[-1][0]} | {curve[-1][1]} | {best[2]:.3f} (epoch {best[0]}) "
            f"| {' '.join(f'{c[2]:.3f}' for c in tail)} | {tail[-1][2] - tail[0][2]:+.3f} |"
        )
    if not lines:
        return []
    return [
        "",
        "## Training from scratch: how far it got",
        "",
        f"Validation nll (base 2) from each run's `train.log`: its last {last} epochs and their",
        "change. A curve still falling at the end is not converged.",
        "",
        f"| model | epochs | updates | best valid nll | last {last} epochs | change |",
        "|---|---:|---:|---|---|---:|",
        *lines,
    ]
