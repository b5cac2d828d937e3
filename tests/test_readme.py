"""The README's "Prune your own model" steps, run as written on the tiny corpus.

Voita et al. 2019's encoder-only protocol as a user copies it: the steps' bash blocks are read
from README.md, the paths of step 2 and the sizes of step 3 replaced by the tiny corpus's, and
run in one shell, so that the README cannot drift from what the tools accept.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

from tests.helpers import BIN, REPO

SECTION = "## Prune your own model"
# step 3's sizes for a 2-layer × 4-head model trained on 600 sentences (10 updates an epoch)
TINY = {
    "--target-heads 10": "--target-heads 3",
    "--target-heads-warmup-updates 900": "--target-heads-warmup-updates 50",
    "--lr 5e-4": "--lr 0.005",
    "--max-tokens 4096": "--max-tokens 500",
    "--max-epoch 10": "--max-epoch 15",
}


def readme_steps() -> list[str]:
    """The bash blocks of the README's "Prune your own model", in order, dedented."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [textwrap.dedent(b) for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_steps_prune_a_model(tiny_data, stock_checkpoint, tmp_path):
    steps = readme_steps()
    assert len(steps) == 6 and "scripts/setup.sh" in steps[0]  # install: this environment
    paths = {"BASELINE": stock_checkpoint, "DATA": tiny_data, "PRUNED": tmp_path / "pruned"}
    names = re.findall(r"^(\w+)=", steps[1], re.M)
    assert set(paths) <= set(names), steps[1]  # the variables the later steps use
    setup = "".join(f"{k}={v}\n" for k, v in paths.items()) + "SRC=src TGT=tgt\n"
    script = steps[2]
    for readme, tiny in TINY.items():
        assert readme in script, readme
        script = script.replace(readme, tiny)
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", setup + script + "".join(steps[3:])],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "enc-self: 3/8 heads open" in proc.stdout  # step 4
    kept = json.loads((tmp_path / "pruned" / "pruned.pt.heads.json").read_text())  # step 5
    assert sum(map(len, kept["enc-self"])) == 3
    assert sum(map(len, kept["dec-enc"])) == 8  # the decoder untouched
    generated = (tmp_path / "pruned" / "test.gen").read_text()  # step 6: every test sentence
    assert len(re.findall(r"^H-\d+\t", generated, re.M)) == 24
