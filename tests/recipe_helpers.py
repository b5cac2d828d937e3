"""Running the recipe scripts as the README does, on a few hundred real Multi30k sentences
(or a small stand-in corpus in their format) with a tiny model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import BIN, REPO

SHARED = REPO.parent / "shared" / "data" / "multi30k"
TINY = {
    "TRAIN_LINES": "300", "EVAL_LINES": "20", "VOCAB_SIZE": "300", "EMBED_DIM": "16",
    "FFN_DIM": "32", "ENC_LAYERS": "2", "DEC_LAYERS": "1", "HEADS": "4", "MAX_TOKENS": "2000",
    "BASELINE_EPOCHS": "2", "PRUNE_EPOCHS": "1", "BATCH_SIZE": "8", "BEAM": "2",
    "EXTRA_ARGS": "--cpu --num-workers 0", "TRAIN_BASELINE": "1",  # a tiny baseline
    # pruning runs of a few tiny epochs (4 updates each) are too short for a gate to close
    # and end with undecided gates: prune.sh acknowledges both (--allow-slow-gates, and
    # export --force-budget); tests/test_schedule_check.py and test_export.py test the refusals
    "ALLOW_SLOW_GATES": "1", "FORCE_BUDGET": "1",
    # one torch thread per process: on a loaded 2-core machine torch's default two threads
    # spin against each other (beam search of the tiny model: 0.4 s vs 30 s)
    "OMP_NUM_THREADS": "1",
}  # fmt: skip


def recipe(script: str, work: Path, raw: Path, *args: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, **TINY, "WORK_DIR": str(work), "RAW_DIR": str(raw), **env}
    full["PATH"] = f"{BIN}{os.pathsep}{full['PATH']}"
    command = ["bash", str(REPO / "recipes" / script), *args]
    return subprocess.run(command, capture_output=True, text=True, env=full)


def run_recipe(script: str, work: Path, raw: Path, *args: str, **env) -> str:
    proc = recipe(script, work, raw, *args, **env)
    assert proc.returncode == 0, f"{script}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout
