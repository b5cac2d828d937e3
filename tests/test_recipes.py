"""Every recipe script, as the README runs them, on a few hundred real Multi30k sentences."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import BIN, REPO

SHARED = REPO.parent / "shared" / "data" / "multi30k"
TINY = {
    "TRAIN_LINES": "300", "EVAL_LINES": "20", "VOCAB_SIZE": "300", "EMBED_DIM": "16",
    "FFN_DIM": "32", "ENC_LAYERS": "2", "DEC_LAYERS": "1", "HEADS": "4", "MAX_TOKENS": "2000",
    "BASELINE_EPOCHS": "2", "PRUNE_EPOCHS": "1", "BATCH_SIZE": "8", "BEAM": "2",
    "EXTRA_ARGS": "--cpu --num-workers 0",
}  # fmt: skip


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    """The shared Multi30k files when present, else a small parallel corpus in their format."""
    if SHARED.is_dir():
        return SHARED
    folder = tmp_path_factory.mktemp("raw")
    for split, n in (("train", 300), ("val", 20), ("test_2016_flickr", 20),
                     ("test_2017_flickr", 20), ("test_2017_mscoco", 20)):  # fmt: skip
        (folder / f"{split}.en").write_text("".join(f"a dog runs {i} times .\n" for i in range(n)))
        (folder / f"{split}.de").write_text(
            "".join(f"ein hund rennt {i} mal .\n" for i in range(n))
        )
    return folder


def _run(script: str, work: Path, raw: Path, **env) -> str:
    full = dict(os.environ, **TINY, WORK_DIR=str(work), RAW_DIR=str(raw), **env)
    full["PATH"] = f"{BIN}{os.pathsep}{full['PATH']}"
    proc = subprocess.run(
        ["bash", str(REPO / "recipes" / script)], capture_output=True, text=True, env=full
    )
    assert proc.returncode == 0, f"{script}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_quickstart_runs_end_to_end_and_resumes(raw_dir, tmp_path):
    out = _run("quickstart.sh", tmp_path, raw_dir)
    assert "BLEU test_2016_flickr" in out and "runs: " in out
    result = json.loads((tmp_path / "eval" / "baseline" / "test_2016_flickr.json").read_text())
    assert result["sentences"] == 20 and "nrefs:1" in result["signature"]
    assert (tmp_path / "prune" / "enc-self-l0.05" / "gates.txt").exists()
    # a second run skips the finished steps and prints the same table
    assert _run("quickstart.sh", tmp_path, raw_dir).splitlines()[-4:] == out.splitlines()[-4:]


def test_evaluate_refuses_incomplete_output(raw_dir, tmp_path):
    _run("prepare.sh", tmp_path, raw_dir)
    gen = tmp_path / "partial.gen"
    gen.write_text("D-0\t-0.5\tein hund\n")
    proc = subprocess.run(
        [str(BIN / "python"), str(REPO / "recipes" / "lib" / "bleu.py"), str(gen),
         str(tmp_path / "raw" / "test_2016_flickr.de")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "1 hypotheses for 20 references" in proc.stderr
