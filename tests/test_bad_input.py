"""Bad input through the real CLIs: one ``error:`` line last, no traceback, nothing written.

fairseq-headprune's errors (Voita et al. 2019 tools): a wrong flag, checkpoint or file stops
``fairseq-train``/``-generate`` (plugin loaded by ``--user-dir``) and ``fairseq-headprune``
with a non-zero status and a last line naming the flag or file, before any training step
(no ``crash.pt``), leaving every existing file byte-identical.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli

L0 = ["--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1"]
CE = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


def fairseq_train(data: Path, save: Path, *args: str) -> subprocess.CompletedProcess:
    return cli(
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--max-update", "1", "--save-dir", save, *args, check=False,
    )  # fmt: skip


def assert_error(proc: subprocess.CompletedProcess, start: str) -> str:
    """Exit status ≠ 0, no traceback, and a last stderr line starting ``error: {start}``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[-1].startswith(f"error: {start}"), proc.stderr[-3000:]
    return lines[-1]


def digests(*paths: Path) -> dict[str, str]:
    """sha256 of every file under ``paths``: what must stay byte-identical."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")))]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def assert_nothing_written(save: Path) -> None:
    assert not save.exists() or not list(save.iterdir()), list(save.iterdir())


@pytest.mark.parametrize(
    "args, start",
    [
        ([*L0, "--target-heads", "100"], "--target-heads: 100 heads wanted for total"),
        ([*L0, "--head-gates", "enc-self", "--target-heads", "dec-self:2"],
         "--target-heads: a budget for dec-self"),
        ([*L0, "--target-heads", "-1"], "--target-heads: the number of heads must be >= 0"),
        ([*L0, "--arch", "transformer", "--target-heads", "3"],
         "--target-heads: the model has no head gates to prune"),
        ([*L0, "--head-gates", "none", "--l0-lambda", "0.1"],
         "--l0-lambda: the model has no head gates to prune"),
        ([*L0, "--l0-lambda", "nan"], "--l0-lambda nan: must be a number >= 0"),
        ([*L0, "--l0-lambda", "-1"], "--l0-lambda -1.0: must be a number >= 0"),
        ([*L0, "--target-heads", "4", "--target-heads-lr-scale", "inf"],
         "--target-heads-lr-scale inf"),
        ([*CE, "--head-gate-init-log-alpha", "nan"], "--head-gate-init-log-alpha nan"),
        ([*CE, "--head-gate-temperature", "0"], "--head-gate-temperature 0.0: must be"),
        ([*CE, "--head-gates", "enc-slef"], "--head-gates: unknown attention type(s) ['enc-slef']"),
    ],
)  # fmt: skip
def test_bad_flags_stop_fairseq_train_before_training(tiny_data, tmp_path, args, start):
    before = digests(tiny_data)
    save = tmp_path / "save"
    assert_error(fairseq_train(tiny_data, save, *args), start)
    assert_nothing_written(save)  # no crash.pt, no checkpoint
    assert digests(tiny_data) == before


@pytest.fixture(scope="module")
def gated_and_pruned(stock_checkpoint, tiny_data, tmp_path_factory) -> dict[str, Path]:
    """A checkpoint gated on enc-self only, and the stock one cut to 2 of 4 encoder heads."""
    root = tmp_path_factory.mktemp("fit")
    gated = root / "gated"
    proc = fairseq_train(
        tiny_data, gated, *CE, "--head-gates", "enc-self",
        "--finetune-from-model", stock_checkpoint,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    mask = root / "mask.json"
    mask.write_text(json.dumps({"enc-self": [[0, 1], [2, 3]]}))
    pruned = root / "pruned.pt"
    cli("fairseq-headprune", "export", "--path", stock_checkpoint, "--out", pruned, "--mask", mask)
    return {"gated": gated / "checkpoint_last.pt", "pruned": pruned}


@pytest.mark.parametrize(
    "source, args, start",
    [
        ("stock", ["--encoder-ffn-embed-dim", "64"],
         "checkpoint tensor encoder.layers.0.fc1.weight has shape (32, 16)"),
        ("gated", ["--head-gates", "dec-self"],
         "the checkpoint was trained with --head-gates enc-self but this model has --head-gates "
         "dec-self"),
        ("resume", ["--head-gates", "enc-self,dec-enc"],
         "the checkpoint was trained with --head-gates enc-self but this model has --head-gates "
         "enc-self,dec-enc"),
        ("pruned", [], "the checkpoint is physically pruned (enc-self layer 0 has 2 heads"),
        ("pruned", ["--kept-heads", '{"enc-self": [[0], [1]]}'],
         "--kept-heads does not fit the checkpoint: enc-self layer 0 has 2 heads"),
    ],
)  # fmt: skip
def test_the_plugins_diagnosis_is_the_last_line(
    tiny_data, tmp_path, stock_checkpoint, gated_and_pruned, source, args, start
):
    if source == "resume":  # the gated run's own save dir, resumed from checkpoint_last.pt
        save = gated_and_pruned["gated"].parent
        before = digests(save)
        last = assert_error(fairseq_train(tiny_data, save, *CE, *args), start)
        assert digests(save) == before  # no crash.pt, no checkpoint rewritten
    else:
        ckpt = stock_checkpoint if source == "stock" else gated_and_pruned[source]
        before = digests(ckpt.parent)
        save = tmp_path / "save"
        finetune = ("--finetune-from-model", ckpt)
        last = assert_error(fairseq_train(tiny_data, save, *CE, *finetune, *args), start)
        assert_nothing_written(save)
        assert digests(ckpt.parent) == before
    assert "architectures match" not in last


@pytest.fixture(scope="module")
def bad_checkpoints(stock_checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    text, empty = root / "notes.txt", root / "empty.pt"
    text.write_text("these are my notes, not a checkpoint\n")
    empty.write_bytes(b"")
    data = stock_checkpoint.read_bytes()
    truncated = root / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    state = torch.load(stock_checkpoint, weights_only=False)
    state["extra_state"]["note"] = datetime.date(2024, 1, 1)  # not allow-listed
    untrusted = root / "untrusted.pt"
    torch.save(state, untrusted)
    return {"text": text, "empty": empty, "truncated": truncated, "untrusted": untrusted}


EXPECTED = {
    "text": " is not a checkpoint (not a file written by torch.save",
    "empty": " is empty, not a checkpoint",
    "truncated": " is truncated or damaged",
    "untrusted": ": refused to load: it contains an object that is not allow-listed "
    "(datetime.date)",
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_unreadable_checkpoints_are_one_line_in_every_tool(bad_checkpoints, tmp_path, kind):
    path = bad_checkpoints[kind]
    before = digests(path.parent)
    assert_error(cli("fairseq-headprune", "gates", path, check=False), f"{path}{EXPECTED[kind]}")
    out = tmp_path / "pruned.pt"
    proc = cli("fairseq-headprune", "export", "--path", path, "--out", out, check=False)
    assert_error(proc, f"{path}{EXPECTED[kind]}")
    assert not out.exists() and "weights_only" not in proc.stderr
    assert digests(path.parent) == before


def test_fairseq_clis_report_unreadable_checkpoints_in_one_line(
    tiny_data, bad_checkpoints, tmp_path
):
    untrusted = bad_checkpoints["untrusted"]
    proc = cli(
        "fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", untrusted,
        "--source-lang", "src", "--target-lang", "tgt", "--cpu", check=False,
    )  # fmt: skip
    assert_error(proc, f"{untrusted}{EXPECTED['untrusted']}")
    assert "weights_only" not in proc.stderr
    save = tmp_path / "save"
    text = bad_checkpoints["text"]
    proc = fairseq_train(tiny_data, save, *CE, "--finetune-from-model", text)
    assert_error(proc, f"{text}{EXPECTED['text']}")
    assert_nothing_written(save)


def test_headprune_traceback_shows_the_traceback_above_the_line(bad_checkpoints, monkeypatch):
    monkeypatch.setenv("HEADPRUNE_TRACEBACK", "1")
    proc = cli("fairseq-headprune", "gates", bad_checkpoints["text"], check=False)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {bad_checkpoints['text']}")


def test_export_keeps_an_existing_heads_json_and_follows_the_umask(stock_checkpoint, tmp_path):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"enc-self": [[0, 1], [2, 3]]}))
    out = tmp_path / "pruned.pt"
    heads_json = tmp_path / "pruned.pt.heads.json"
    heads_json.write_text("an earlier export's heads\n")
    export = ("fairseq-headprune", "export", "--path", stock_checkpoint, "--out", out)
    proc = cli(*export, "--mask", mask, check=False)
    assert_error(proc, f"{heads_json} exists; pass --force")
    assert not out.exists() and heads_json.read_text() == "an earlier export's heads\n"
    old = os.umask(0o027)
    try:
        cli(*export, "--mask", mask, "--force")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o640
    assert heads_json.stat().st_mode & 0o777 == 0o640
    assert json.loads(heads_json.read_text())["enc-self"] == [[0, 1], [2, 3]]


def test_malformed_mask_names_the_file(stock_checkpoint, tmp_path):
    mask = tmp_path / "mask.json"
    mask.write_text('{"enc-self": [[0, 1]')
    out = tmp_path / "pruned.pt"
    proc = cli(
        "fairseq-headprune", "export", "--path", stock_checkpoint, "--out", out, "--mask", mask,
        check=False,
    )  # fmt: skip
    assert_error(proc, f"--mask {mask}: not valid JSON")
    assert not out.exists()


def test_bench_on_a_missing_checkpoint_is_one_line(tiny_data, stock_checkpoint, tmp_path):
    missing = tmp_path / "missing.pt"
    proc = cli(
        "fairseq-headprune", "bench", tiny_data, "--full", stock_checkpoint, "--pruned", missing,
        check=False,
    )  # fmt: skip
    assert_error(proc, f"no checkpoint at {missing}")


def test_score_on_an_empty_split_names_split_and_file(tiny_data, stock_checkpoint, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for f in tiny_data.iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    empty = data / "test.src-tgt.src.bin"
    empty.write_bytes(b"")
    out = tmp_path / "scores"
    proc = cli(
        "fairseq-headprune", "score", data, "--path", stock_checkpoint, "--subset", "test",
        "--out", out, check=False,
    )  # fmt: skip
    last = assert_error(proc, f"split 'test' of {data} is empty (empty file")
    assert str(empty) in last and not out.exists()


def test_prepare_refuses_source_and_target_of_different_lengths(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        (raw / f"{split}.en").write_text("a b\nc d\n")
        (raw / f"{split}.de").write_text("x y\nz w\n")
    (raw / "val.de").write_text("x y\n")
    work = tmp_path / "work"
    proc = subprocess.run(
        ["bash", str(Path(USER_DIR).parent / "recipes" / "prepare.sh")],
        capture_output=True,
        text=True,
        env=dict(os.environ, RAW_DIR=str(raw), WORK_DIR=str(work), SRC="en", TGT="de"),
    )
    last = assert_error(proc, f"{work}/raw/val.en has 2 lines but {work}/raw/val.de has 1")
    assert "line-aligned" in last and not (work / "spm" / "spm.model").exists()


def test_hydra_deprecation_warnings_are_silenced_once_the_plugin_is_loaded():
    # fairseq-generate 2>&1 | grep ^T took these warnings' lines for reference sentences
    code = (
        "import sys, fairseq_headprune; from fairseq.dataclass.initialize import "
        "hydra_init; from fairseq.dataclass.utils import convert_namespace_to_omegaconf; "
        "from fairseq import options; hydra_init(); "
        "p = options.get_generation_parser(); "
        "convert_namespace_to_omegaconf(options.parse_args_and_arch(p, ['data']))"
    )
    env = dict(os.environ, PYTHONWARNINGS="default")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert not [line for line in lines if line.startswith(("T", "P", "W", "S"))], lines
    assert "version_base" not in proc.stderr and "/hydra/" not in proc.stderr
    assert "ConfigStore" not in proc.stderr


def _raise_in_worker(rank: int) -> None:
    from fairseq_headprune.errors import HeadpruneError

    raise HeadpruneError("--target-heads: 9 heads wanted for total, but it has only 8")


def test_a_spawned_workers_input_error_is_recognised():
    # multi-GPU fairseq-train spawns its ranks: the parent sees only the text of the error
    from fairseq_headprune.errors import user_error

    with pytest.raises(Exception) as raised:
        torch.multiprocessing.spawn(_raise_in_worker, nprocs=1, join=True)
    err = user_error(raised.value)
    assert str(err) == "--target-heads: 9 heads wanted for total, but it has only 8"
