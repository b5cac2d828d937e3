"""The plugin registers its fairseq components in every order of imports, and its
checkpoint tools start without importing fairseq (fairseq_headprune.registration)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, USER_DIR

REGISTERED = """
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
archs = [a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "GatedTransformerModel"]
print(",".join(sorted(archs)), "label_smoothed_cross_entropy_l0" in CRITERION_REGISTRY)
"""
PRESETS = [
    "gated_transformer", "gated_transformer_iwslt_de_en",
    "gated_transformer_vaswani_wmt_en_de_big", "gated_transformer_wmt_en_de",
]  # fmt: skip


def _python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize(
    "imports",
    [
        "import fairseq, fairseq_headprune",  # a fairseq CLI's --user-dir
        "import fairseq_headprune.sites, fairseq",  # a light module first, fairseq after
        "import fairseq_headprune.budget; from fairseq.models import transformer",  # a submodule
        # a module of the package that imports fairseq itself, while it is half-imported
        "import fairseq_headprune.gated_attention",
        "import fairseq_headprune.gated_transformer",
        "import fairseq_headprune.scoring.command",
    ],
)
def test_every_import_order_registers_the_model_and_criterion(imports):
    assert _python(f"{imports}\n{REGISTERED}").split() == [",".join(PRESETS), "True"]


def test_user_dir_after_a_light_import_still_finds_the_arch():
    """fairseq's import_user_module skips a package that is already imported: the import
    hook must have registered everything by the time fairseq parses --arch."""
    code = f"""
import fairseq_headprune.sites
from fairseq import options
parser = options.get_training_parser()
args = options.parse_args_and_arch(parser, [
    "data", "--user-dir", {USER_DIR!r}, "--task", "translation", "--arch", "gated_transformer",
    "--criterion", "label_smoothed_cross_entropy_l0", "--optimizer", "adam", "--target-heads", "3",
])
print(args.arch, args.criterion, args.target_heads)
"""
    assert _python(code).split() == ["gated_transformer", "label_smoothed_cross_entropy_l0", "3"]


def test_checkpoint_tools_run_without_fairseq(gated_checkpoint, tmp_path):
    """gates, flags and export read and write checkpoints with torch alone (half the start-up
    time: importing fairseq takes seconds)."""
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"enc-self": [[0, 1], [2]]}))
    out = tmp_path / "pruned.pt"
    code = f"""
import sys
from fairseq_headprune import cli
cli.main(["gates", "--json", {str(gated_checkpoint)!r}])
cli.main(["flags", {str(gated_checkpoint)!r}])
cli.main(["export", "--path", {str(gated_checkpoint)!r}, "--mask", {str(mask)!r},
          "--out", {str(out)!r}])
print("fairseq imported:", "fairseq" in sys.modules)
"""
    stdout = _python(code)
    assert stdout.splitlines()[-1] == "fairseq imported: False"
    assert '"sites"' in stdout and "--encoder-layers 2" in stdout and "enc-self: kept 3/8" in stdout
    assert out.is_file()
