"""Copy evaluations into the committed results tree, so that every BLEU of the study (Voita et
al. 2019's protocol: every pruned model next to its fair reference) is recomputable from
committed files.

    python -m recipes.study.publish STUDY EVAL/NAME [EVAL/NAME ...] [--runs SUBDIR]

For each evaluation folder (``recipes/evaluate.sh``'s ``$WORK_DIR/eval/NAME``) writes
``STUDY/eval/NAME/``: the BLEU JSONs, ``model.json``, ``lenpen`` and the hypotheses gzipped
(``<split>.hyp.gz``, which ``recipes.study.summary`` reads). When model.json names a
``run_dir``, that run's records (``*.json``, ``*.jsonl``, ``*.txt``; no checkpoints) go to
``STUDY/SUBDIR/<run folder's name>/`` (a JSON record over 64 kB gzipped, ``<name>.gz``) and
model.json's ``run_dir`` is rewritten to point there, with ``validation.json``: the validation
nll per epoch and the best epoch, read from the run's ``train.log`` (the log itself, mostly
progress lines, stays behind). A run inside a pruning run's folder (phase 2 of
``recipes/prune.sh``, ``<run>/phase2-s<seed>``) goes to ``SUBDIR/<run>/phase2-s<seed>/``. A
``bench`` of its own (a fine-tuned model's) goes there as ``<NAME>.bench.json``. An
evaluation that misses its hypotheses for a scored split is refused before anything is
copied.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
from pathlib import Path

from recipes.study.records import read_hypotheses
from recipes.study.training import best_epoch, validation_curve

RECORDS = ("*.json", "*.jsonl", "*.txt")
GZIP_ABOVE = 64_000  # bytes


def check(folder: Path) -> None:
    if not folder.is_dir():
        raise SystemExit(f"error: no evaluation folder {folder}")
    for record in folder.glob("*.json"):
        split = record.name[: -len(".json")]
        if record.name != "model.json" and read_hypotheses(folder, split) is None:
            raise SystemExit(f"error: {record} has no {split}.hyp next to it")


def copy_record(f: Path, dest: Path) -> None:
    """Copy one run record; a JSON file over ``GZIP_ABOVE`` bytes (prune.json with every mask
    value) is written gzipped as ``<name>.gz``."""
    data = f.read_bytes()
    if f.suffix == ".json" and len(data) > GZIP_ABOVE:
        (dest / f"{f.name}.gz").write_bytes(gzip.compress(data, mtime=0))
    else:
        (dest / f.name).write_bytes(data)


def validation_record(run: Path) -> dict | None:
    """The validation nll per epoch of ``run``'s ``train.log`` and the epoch of its
    ``checkpoint_best.pt``; None without a log or a validation line."""
    log = run / "train.log"
    curve = validation_curve(log) if log.is_file() else []
    if not curve:
        return None
    return {
        "source": "train.log (fairseq-train, nll base 2)",
        "epochs": [{"epoch": e, "updates": u, "valid_nll": nll} for e, u, nll in curve],
        "best_epoch": best_epoch(log, curve)[0],
    }


def run_destination(run: Path, study: Path, runs: str) -> Path:
    """Where ``run``'s records go: ``STUDY/SUBDIR/<name>``, a phase-2 run (inside the pruning
    run whose export it fine-tunes) under its pruning run's name."""
    if (run.parent / "pruned.pt.heads.json").is_file():
        return study / runs / run.parent.name / run.name
    return study / runs / run.name


def publish(folder: Path, study: Path, runs: str) -> Path:
    """Copy one evaluation (and its run's records) under ``study``; return the new folder."""
    out = study / "eval" / folder.name
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.suffix == ".json" or f.name == "lenpen" or f.name.endswith(".hyp.gz"):
            shutil.copyfile(f, out / f.name)
        elif f.suffix == ".hyp":
            (out / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes(), mtime=0))
    record_file = out / "model.json"
    if record_file.is_file():
        record = json.loads(record_file.read_text())
        if record.get("run_dir") and (folder / record["run_dir"]).is_dir():
            run = (folder / record["run_dir"]).resolve()
            dest = run_destination(run, study, runs)
            dest.mkdir(parents=True, exist_ok=True)
            for pattern in RECORDS:
                for f in run.glob(pattern):
                    copy_record(f, dest)
            curve = validation_record(run)
            if curve:
                (dest / "validation.json").write_text(json.dumps(curve, indent=1) + "\n")
            record["run_dir"] = os.path.relpath(dest, out)
            if record.get("bench") and (folder / record["bench"]).is_file():  # its own speed
                bench = dest / f"{folder.name}.bench.json"
                shutil.copyfile(folder / record["bench"], bench)
                record["bench"] = os.path.relpath(bench, out)
            record_file.write_text(json.dumps(record, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("study", type=Path, help="the study folder in results/ (gets eval/NAME/)")
    p.add_argument("evaluations", type=Path, nargs="+", help="evaluate.sh's eval/NAME folders")
    p.add_argument(
        "--runs",
        default="runs",
        help="folder of STUDY for the runs' records (default: runs)",
    )
    args = p.parse_args(argv)
    for folder in args.evaluations:
        check(folder)
    for folder in args.evaluations:
        print(publish(folder, args.study, args.runs))


if __name__ == "__main__":
    main()
