"""Every recipe script, as the README runs them, on a few hundred real Multi30k sentences."""

import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU

from tests.helpers import BIN, REPO, TINY_ARCH, TRAIN_COMMON, USER_DIR, cli

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


def _recipe(script: str, work: Path, raw: Path, *args: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, **TINY, "WORK_DIR": str(work), "RAW_DIR": str(raw), **env}
    full["PATH"] = f"{BIN}{os.pathsep}{full['PATH']}"
    command = ["bash", str(REPO / "recipes" / script), *args]
    return subprocess.run(command, capture_output=True, text=True, env=full)


def _run(script: str, work: Path, raw: Path, *args: str, **env) -> str:
    proc = _recipe(script, work, raw, *args, **env)
    assert proc.returncode == 0, f"{script}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def quickstart_run(raw_dir, tmp_path_factory) -> tuple[Path, str]:
    """The quickstart's outputs (baseline, pruned run, their BLEU) and its stdout, made once."""
    work = tmp_path_factory.mktemp("quickstart")  # TINY has 8 encoder heads: keep 5
    return work, _run("quickstart.sh", work, raw_dir, TARGET_HEADS="5", TARGET_WARMUP="2")


def test_quickstart_runs_end_to_end_and_resumes(quickstart_run, raw_dir):
    tmp_path, out = quickstart_run
    assert "BLEU test_2016_flickr" in out and "runs: " in out
    table = out.split("BLEU test_2016_flickr\n")[1].splitlines()
    assert table[0].split()[:2] == ["baseline", "8"]  # TINY: 2 encoder layers x 4 heads
    report = tmp_path / "report" / "report.md"
    assert f"report: {report}" in out and "pruned-k5" in report.read_text()
    result = json.loads((tmp_path / "eval" / "baseline" / "test_2016_flickr.json").read_text())
    assert result["sentences"] == 20 and "nrefs:1" in result["signature"]
    assert table[1].split()[0] == "pruned-k5"
    log = (tmp_path / "prune" / "enc-self-k5" / "train.log").read_text()
    assert "'target_heads': '5', 'target_heads_warmup_updates': 2" in log
    assert "head_gate_lr_scale=60.0" in log
    records = (tmp_path / "prune" / "enc-self-k5" / "gate_trajectory.jsonl").read_text()
    assert json.loads(records.splitlines()[0])["num_updates"] == 0
    # the pruned model exported with its closed heads removed (with 2 tiny epochs the gates
    # have not closed yet: FORCE_BUDGET=1 keeps the run's --target-heads budget, the 5 most open)
    run = tmp_path / "prune" / "enc-self-k5"
    assert f"pruned model, closed heads removed: {run / 'pruned.pt'}" in out
    kept = json.loads((run / "pruned.pt.heads.json").read_text())
    assert sum(map(len, kept["enc-self"])) == 5
    assert "enc-self: kept 5/8" in (run / "export.txt").read_text()
    pruned = torch.load(run / "pruned.pt", weights_only=False)
    assert not any("head_gate" in k for k in pruned["model"])
    # a second run skips the finished steps and prints the same table
    again = _run("quickstart.sh", tmp_path, raw_dir, TARGET_HEADS="5", TARGET_WARMUP="2")
    assert again.splitlines()[-4:] == out.splitlines()[-4:]
    # TARGET_HEADS= (empty): a λ instead of a head budget
    by_lambda = _run("quickstart.sh", tmp_path, raw_dir, TARGET_HEADS="")
    assert by_lambda.split("BLEU test_2016_flickr\n")[1].splitlines()[1].startswith("pruned-l0.05")
    assert "'l0_lambda': 0.05" in (tmp_path / "prune" / "enc-self-l0.05" / "train.log").read_text()


def test_evaluate_refuses_incomplete_output(raw_dir, tmp_path):
    _run("prepare.sh", tmp_path, raw_dir)
    gen = tmp_path / "partial.gen"
    gen.write_text("D-0\t-0.5\tein hund\n")
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.bleu", str(gen),
         str(tmp_path / "raw" / "test_2016_flickr.de")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0 and "1 hypotheses for 20 references" in proc.stderr


@pytest.fixture(scope="module")
def quickstart_work(quickstart_run) -> Path:
    return quickstart_run[0]


def test_prune_with_an_exact_head_budget(quickstart_work, raw_dir):
    work = quickstart_work
    _run("prune.sh", work, raw_dir, TARGET_HEADS="3", TARGET_WARMUP="2", MAX_EPOCH="2")
    run = work / "prune" / "enc-self-k3"
    assert (run / "DONE").exists() and (run / "gate_trajectory.jsonl").exists()
    log = (run / "train.log").read_text()
    assert "'target_heads': '3', 'target_heads_warmup_updates': 2" in log
    assert "| target_total " in log  # the epoch summary


def test_controls_and_report(quickstart_work, raw_dir):
    work = quickstart_work
    # a budget of 5 of the 8 encoder heads: the pruned run's structure under a mask, exported
    mask = work / "keep5.json"
    mask.write_text(json.dumps({"enc-self": [[0, 2], [1, 2, 3]]}))
    structure = work / "structure5.pt"
    subprocess.run(
        [str(BIN / "fairseq-headprune"), "export", "--mask", str(mask), "--out", str(structure),
         "--path", str(work / "prune" / "enc-self-k5" / "checkpoint_last.pt")],
        check=True, capture_output=True,
    )  # fmt: skip
    settings = dict(
        BASELINE=str(work / "baseline" / "checkpoint_best.pt"), PRUNED=str(structure),
        SEEDS="1", FT_EPOCHS="1", SCRATCH_EPOCHS="1", SCORE_SENTENCES="20", SUBSETS="test",
    )  # fmt: skip
    _run("controls.sh", work, raw_dir, **settings)
    names = ["masked-structure5", "refit-structure5", "scratch-structure5", "random-s1-k5"]
    names += ["michel-k5", "lrp-k5"]
    for name in names:
        assert (work / "eval" / name / "test_2016_flickr.json").exists(), name
        trained = name != "masked-structure5"  # masked: cut from the baseline, no training
        assert (work / "controls" / name / "DONE").exists() == trained, name
        kept = json.loads((work / "eval" / name / "model.json").read_text())["kept_heads"]
        assert sum(map(len, kept["enc-self"])) == 5, name
    # Michel et al.: 10 % of the 8 heads (1) per importance step, 8 -> 5 in three steps
    steps = json.loads((work / "controls" / "michel-k5" / "mask.json.steps.json").read_text())
    assert [len(s["removed"]) for s in steps["steps"]] == [0, 1, 1, 1]
    # the scratch run has the structure's exact heads
    scratch_heads = (work / "controls" / "scratch-structure5" / "kept_heads.json").read_text()
    assert scratch_heads == Path(f"{structure}.heads.json").read_text()
    # refit fine-tunes the same heads from the baseline's weights: it starts from the masked
    # control's model
    refit = json.loads((work / "eval" / "refit-structure5" / "model.json").read_text())
    assert refit["method"] == "refit" and refit["kept_heads"] == json.loads(scratch_heads)
    start = [torch.load(work / "controls" / n / "pruned.pt", weights_only=False)["model"]
             for n in ("refit-structure5", "masked-structure5")]  # fmt: skip
    assert start[0].keys() == start[1].keys()
    assert all(torch.equal(start[0][k], start[1][k]) for k in start[0])
    # ... and the baseline's layout, pre-norm by default (`fairseq-headprune flags` carries
    # --*-normalize-before; the post-norm case: test_baseline_norm_layout)
    paths = ("baseline/checkpoint_best.pt", "controls/scratch-structure5/checkpoint_best.pt")
    cfgs = [torch.load(work / p, weights_only=False)["cfg"]["model"] for p in paths]
    assert cfgs[0].encoder_normalize_before and cfgs[0].decoder_normalize_before
    for flag in ("encoder_normalize_before", "decoder_normalize_before", "share_all_embeddings"):
        assert getattr(cfgs[0], flag) == getattr(cfgs[1], flag), flag
    log = (work / "controls" / "refit-structure5" / "train.log").read_text()
    assert f"'finetune_from_model': '{work}/controls/refit-structure5/pruned.pt'" in log
    # resumable: a second run finds every step done
    _run("controls.sh", work, raw_dir, **dict(settings, CONTROLS="michel lrp"))
    # any checkpoint under a name of one's own: evaluate.sh records it for the report
    _run("evaluate.sh", work, raw_dir, "my-export", str(structure), SUBSETS="test")
    assert (work / "eval" / "my-export" / "checkpoint").read_text().strip() == str(structure)
    other = str(work / "baseline" / "checkpoint_best.pt")  # a second model under that name
    proc = _recipe("evaluate.sh", work, raw_dir, "my-export", other, SUBSETS="test")
    assert proc.returncode != 0 and "use another NAME" in proc.stderr

    env = dict(os.environ, OMP_NUM_THREADS="1", WORK_DIR=str(work))
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.report"],
        capture_output=True, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (work / "report" / "report.md").read_text()
    assert (work / "report" / "bleu_vs_heads.png").stat().st_size > 0
    table = report.split("\n## ")[0]  # the BLEU-vs-heads table, before the other sections
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if "|" in line}
    for name, method, heads in [
        ("baseline", "baseline", "8/8"), ("pruned-k5", "target-heads", None),
        ("refit-structure5", "refit", "5/8"), ("scratch-structure5", "scratch", "5/8"),
        ("random-s1-k5", "random", "5/8"),
        ("michel-k5", "michel", "5/8"), ("lrp-k5", "lrp", "5/8"),
        ("masked-structure5", "masked", "5/8"), ("my-export", "exported", "5/8"),
    ]:  # fmt: skip
        assert f"| {method} |" in rows[name], rows[name]
        assert heads is None or f"| {heads} |" in rows[name], rows[name]
    assert "mean ± sd" in report
    # how far the models trained from scratch got (the numbers: test_report_shows_how_far_…)
    training = report.split("## Training from scratch")[1].split("##")[0]
    curves = [line.split("|")[1].strip() for line in training.splitlines()
              if line.startswith("| ") and "---" not in line][1:]  # fmt: skip
    assert curves == ["baseline", "scratch-structure5"]
    # BLEU by source length, against sacreBLEU on the bucket's sentences computed here
    lengths = json.loads((work / "report" / "length_buckets.json").read_text())
    assert sum(lengths["sentences"]) == 20 and "## BLEU by source length" in report
    src = (work / "raw" / "test_2016_flickr.en").read_text().splitlines()
    refs = (work / "raw" / "test_2016_flickr.de").read_text().splitlines()
    hyps = (work / "eval" / "masked-structure5" / "test_2016_flickr.hyp").read_text().splitlines()
    short = [i for i, line in enumerate(src) if len(line.split()) <= 10]
    expected = BLEU().corpus_score([hyps[i] for i in short], [[refs[i] for i in short]]).score
    assert lengths["sentences"][0] == len(short) > 0
    assert lengths["bleu"]["masked-structure5"][0] == round(expected, 2)


def test_baseline_norm_layout(quickstart_work, raw_dir, tmp_path):
    """NORM=post (the default is pre, see test_controls_and_report) trains fairseq's post-norm
    layout, and the from-scratch control of a post-norm baseline is post-norm too: the
    control recipes read the layout back from the checkpoint, and its epochs from the
    baseline's checkpoint_last.pt. A NORM it does not know is refused."""
    for name in ("data-bin", "raw"):  # the quickstart's data, runs of this test's own
        (tmp_path / name).symlink_to(quickstart_work / name)
    _run("train_baseline.sh", tmp_path, raw_dir, MAX_EPOCH="1", NORM="post")
    baseline = tmp_path / "baseline" / "checkpoint_best.pt"
    state = torch.load(baseline, weights_only=False)
    args = state["cfg"]["model"]
    assert not args.encoder_normalize_before and not args.decoder_normalize_before
    assert not {"encoder.layer_norm.weight", "decoder.layer_norm.weight"} & set(state["model"])
    # MAX_EPOCH=<the epoch reached> ends an unfinished run where it is (how a baseline stopped
    # by the validation-BLEU rule gets its DONE): fairseq-train resumes, trains no epoch
    (tmp_path / "baseline" / "DONE").unlink()
    _run("train_baseline.sh", tmp_path, raw_dir, MAX_EPOCH="1", NORM="post")
    log = (tmp_path / "baseline" / "train.log").read_text()
    assert (tmp_path / "baseline" / "DONE").exists() and log.count("done training") == 2
    assert log.count("| INFO | train | epoch 001 |") == 1 and "epoch 002" not in log
    mask, structure = tmp_path / "keep3.json", tmp_path / "structure3.pt"
    mask.write_text(json.dumps({"enc-self": [[0, 1], [2]]}))
    subprocess.run(
        [str(BIN / "fairseq-headprune"), "export", "--mask", str(mask), "--out", str(structure),
         "--path", str(baseline)],
        check=True, capture_output=True,
    )  # fmt: skip
    # no SCRATCH_EPOCHS: the control trains as many epochs as the baseline's run (1)
    proc = _recipe("controls.sh", tmp_path, raw_dir, BASELINE=str(baseline),
                   PRUNED=str(structure), CONTROLS="scratch", SUBSETS="test")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "from scratch for 1 epochs, as many as the baseline" in proc.stderr
    scratch_log = (tmp_path / "controls" / "scratch-structure3" / "train.log").read_text()
    assert "| INFO | train | epoch 001 |" in scratch_log and "epoch 002" not in scratch_log
    scratch = tmp_path / "controls" / "scratch-structure3" / "checkpoint_best.pt"
    scratch_args = torch.load(scratch, weights_only=False)["cfg"]["model"]
    assert not scratch_args.encoder_normalize_before and not scratch_args.decoder_normalize_before
    # its model.json counts kept and total heads from the (gated, reduced) checkpoint: the
    # totals are the baseline's, so the record still reads once the checkpoint is gone
    enc = args.encoder_layers * args.encoder_attention_heads
    dec = args.decoder_layers * args.decoder_attention_heads
    record = json.loads((tmp_path / "eval" / "scratch-structure3" / "model.json").read_text())
    assert record["method"] == "scratch" and "setting" not in record and "baseline" not in record
    assert record["heads"] == {"enc-self": [3, enc], "dec-self": [dec, dec], "dec-enc": [dec, dec]}
    # a run made from another evaluated baseline says so (run.sh's first-baseline runs)
    subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.controls", "record",
         "--eval-dir", str(tmp_path / "eval" / "other"), "--method", "scratch",
         "--checkpoint", str(scratch), "--kept", str(structure) + ".heads.json",
         "--setting", "first baseline", "--baseline", "first-baseline"],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    other = json.loads((tmp_path / "eval" / "other" / "model.json").read_text())
    assert other == {**record, "setting": "first baseline", "baseline": "first-baseline"}
    # phase 2 of a gated run is named by its seed: refused without one, nothing written
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.controls", "record",
         "--eval-dir", str(tmp_path / "eval" / "p2"), "--method", "two-phase",
         "--checkpoint", str(scratch), "--kept", str(structure) + ".heads.json",
         "--phase2-of", str(scratch)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0 and "--phase2-of needs the phase-2 --seed" in proc.stderr
    assert not (tmp_path / "eval" / "p2").exists()
    proc = _recipe("train_baseline.sh", tmp_path, raw_dir, BASELINE_DIR=str(tmp_path / "x"),
                   NORM="sandwich")  # fmt: skip
    assert proc.returncode != 0 and "NORM must be post or pre, not 'sandwich'" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_controls_at_a_head_count_without_a_pruned_run(quickstart_work, raw_dir):
    """BUDGET=K: the controls that need only a count run before (or beside) the pruning run."""
    work = quickstart_work
    settings = dict(
        BASELINE=str(work / "baseline" / "checkpoint_best.pt"), FT_EPOCHS="1",
        SCORE_SENTENCES="20", SUBSETS="test",
    )  # fmt: skip
    _run("controls.sh", work, raw_dir, **settings, BUDGET="3", SEEDS="7")
    run = work / "controls" / "random-s7-k3"
    for name in ("random-s7-k3", "michel-k3", "lrp-k3"):  # BUDGET's default controls
        assert (work / "controls" / name / "DONE").exists(), name
        kept = json.loads((work / "eval" / name / "model.json").read_text())["kept_heads"]
        assert sum(map(len, kept["enc-self"])) == 3, name
    record = json.loads((work / "eval" / "random-s7-k3" / "model.json").read_text())
    assert record["method"] == "random" and record["seed"] == 7
    # the heads of controls.py's random draw at the budget enc-self:3
    draw = work / "draw7.json"
    subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.controls", "topk",
         "--scores", str(work / "controls" / "scores-baseline" / "heads.json"),
         "--metric", "random:7", "--budget", "enc-self:3", "--out", str(draw)],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    assert json.loads((run / "mask.json").read_text()) == json.loads(draw.read_text())
    assert sum(map(len, record["kept_heads"]["enc-self"])) == 3
    # the same run under the long form of the budget: found done, nothing retrained
    before = (run / "train.log").read_text()
    _run(
        "controls.sh", work, raw_dir, **settings, BUDGET="enc-self:3", CONTROLS="random", SEEDS="7"
    )
    assert (run / "train.log").read_text() == before
    # the same run's last checkpoint (a pruning run's rule), evaluated apart: nothing retrained
    _run("controls.sh", work, raw_dir, **settings, BUDGET="3", CONTROLS="random", SEEDS="7",
         CONTROL_CHECKPOINT="last")  # fmt: skip
    assert (run / "train.log").read_text() == before
    last = work / "eval" / "random-s7-k3-last"
    assert (last / "checkpoint").read_text().strip() == str((run / "checkpoint_last.pt").resolve())
    record = json.loads((last / "model.json").read_text())
    assert (record["method"], record["seed"], record["selected"]) == ("random", 7, "last")
    assert record["checkpoint"] == str((run / "checkpoint_last.pt").resolve())
    assert json.loads((last / "test_2016_flickr.json").read_text())["sentences"] > 0
    for extra, message in [
        (dict(BUDGET="3", CONTROL_CHECKPOINT="final"), "best, last or both, not 'final'"),
        (dict(BUDGET="3", CONTROLS="masked"), "needs the pruned run's heads"),
        (dict(BUDGET="3", PRUNED=str(work / "baseline" / "checkpoint_best.pt")), "not both"),
        (dict(BUDGET="9", CONTROLS="random"), "enc-self has 8 heads, not 9"),
        (dict(BUDGET="dec:2", CONTROLS="random"), "expected K or TYPE:K"),
        (dict(BUDGET="enc-self:2,enc-self:3", CONTROLS="random"), "given more than once"),
        (dict(CONTROLS="random"), "or BUDGET to a head count"),
    ]:
        proc = _recipe("controls.sh", work, raw_dir, **{**settings, **extra})
        assert proc.returncode != 0 and message in proc.stderr, (extra, proc.stderr[-1000:])


def test_report_reads_a_record_made_where_the_checkpoint_was(tmp_path, monkeypatch):
    """model.json's optional "setting", "heads" and "gated": a row without its checkpoint."""
    from recipes.study import records
    from recipes.study.heads import heads_markdown

    for name, heads, gated in [
        ("pruned-k10", {"enc-self": [10, 48], "dec-self": [24, 24], "dec-enc": [24, 24]},
         ["enc-self"]),
        ("joint", {"enc-self": [5, 48], "dec-self": [12, 24], "dec-enc": [20, 24]},
         ["enc-self", "dec-self", "dec-enc"]),
    ]:  # fmt: skip
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": 31.5}))
        record = {"method": "target-heads", "setting": "target 10", "heads": heads}
        record.update(gated=gated, checkpoint=str(tmp_path / "gone.pt"), kept_heads={})
        (folder / "model.json").write_text(json.dumps(record))
    rows = {r["name"]: r for r in records.collect(tmp_path, {})}
    row = rows["pruned-k10"]
    assert (row["method"], row["setting"], row["bleu"]) == (
        "target-heads",
        "target 10",
        {"test_2016_flickr": 31.5},
    )
    assert records.fmt_heads(row) == "10/48" and not records.is_joint(row)
    joint = rows["joint"]
    assert records.is_joint(joint)
    assert records.fmt_heads(joint) == "5/48 (dec-self 12/24, dec-enc 20/24)"
    # only kept_heads recorded and the checkpoint gone: totals unknown, not joint pruning
    folder = tmp_path / "eval" / "random-s1-k2"
    folder.mkdir()
    (folder / "val.json").write_text(json.dumps({"bleu": 30.0}))
    kept = {"enc-self": [[0], [3]], "dec-self": [[0, 1], [0, 1]], "dec-enc": [[0, 1], [0, 1]]}
    record = {"method": "random", "seed": 1, "checkpoint": str(tmp_path / "gone.pt")}
    (folder / "model.json").write_text(json.dumps({**record, "kept_heads": kept}))
    row = {r["name"]: r for r in records.collect(tmp_path, {})}["random-s1-k2"]
    assert row["heads"]["dec-self"] == [4, None] and row["setting"] == "seed 1"
    assert records.fmt_heads(row) == "2" and not records.is_joint(row)
    # heads counted and listed where the checkpoint was: the surviving heads with their scores
    folder = tmp_path / "eval" / "pruned-k2"
    folder.mkdir()
    (folder / "val.json").write_text(json.dumps({"bleu": 30.5}))
    record = {"method": "target-heads", "checkpoint": str(tmp_path / "gone.pt"),
              "kept_heads": {"enc-self": [[1], [0]]}, "gated": ["enc-self"],
              "heads": {"enc-self": [2, 4], "dec-self": [4, 4], "dec-enc": [4, 4]}}  # fmt: skip
    (folder / "model.json").write_text(json.dumps(record))
    lrp = {(0, 0): 0.6, (0, 1): 0.4, (1, 0): 0.3, (1, 1): 0.7}
    scores = {"heads": [{"site": "enc-self", "layer": la, "head": h, "lrp": v}
                        for (la, h), v in lrp.items()]}  # fmt: skip
    scores["heads"][1]["positional"] = True
    rows = [r for r in records.collect(tmp_path, {}) if r["name"] == "pruned-k2"]
    lines = heads_markdown(rows, scores)
    # kept: 0:1 and 1:0, whose relevance is (0.4 + 0.3) / 2.0 of the layers' total
    assert "| pruned-k2 | enc-self | 0:1 lrp 0.40 (positional), 1:0 lrp 0.30 | 0.35 |" in lines
    # the same record with its gated checkpoint still here: the recorded survivors stand (the
    # checkpoint's gates index all of a layer's heads, not the survivors)
    (tmp_path / "here.pt").write_bytes(b"")
    (folder / "model.json").write_text(
        json.dumps({**record, "checkpoint": str(tmp_path / "here.pt")})
    )
    monkeypatch.setattr(records, "checkpoint_info", lambda *a: pytest.fail("gates applied twice"))
    row = {r["name"]: r for r in records.collect(tmp_path, {})}["pruned-k2"]
    assert records.fmt_heads(row) == "2/4" and row["gated"] == ["enc-self"]
    assert row["kept"] == {"enc-self": [[1], [0]]}


def synthetic_references(work: Path) -> tuple[list[str], list[str]]:
    """60 German-looking references in work/raw/test_2016_flickr.de, and truncated ones."""
    words = "ein hund rennt über die grüne wiese am see neben zwei kindern".split()
    refs = [" ".join(words[i % 5 : i % 5 + 6] + [str(i)]) for i in range(60)]
    noisy = [" ".join(r.split()[: 3 + i % 3]) for i, r in enumerate(refs)]
    (work / "raw").mkdir()
    (work / "raw" / "test_2016_flickr.de").write_text("\n".join(refs) + "\n")
    return refs, noisy


def test_report_tests_each_model_against_the_baseline(tmp_path):
    """Paired bootstrap on the plot split: the baseline with one sentence corrected is no
    significant difference, the references themselves are one; BLEU as sacreBLEU alone."""
    from recipes.study import report

    refs, noisy = synthetic_references(tmp_path)
    near = [refs[0]] + noisy[1:]
    for name, hyps in (("baseline", noisy), ("near", near), ("perfect", refs)):
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "test_2016_flickr.hyp").write_text("\n".join(hyps) + "\n")
        bleu = round(BLEU().corpus_score(hyps, [refs]).score, 2)
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": bleu}))
    report.main(["--work-dir", str(tmp_path), "--tgt", "de"])
    out = json.loads((tmp_path / "report" / "paired_bootstrap.json").read_text())
    models = out["models"]
    assert (out["split"], out["against"], list(models)) == (
        "test_2016_flickr", "baseline", ["baseline", "near", "perfect"],
    )  # fmt: skip
    assert models["baseline"]["p"] is None
    assert models["baseline"]["bleu"] == round(BLEU().corpus_score(noisy, [refs]).score, 2)
    assert 0 < models["near"]["bleu"] - models["baseline"]["bleu"] < 2
    assert models["near"]["p"] > 0.05
    assert models["perfect"]["bleu"] == 100.0 and models["perfect"]["p"] < 0.05
    section = (tmp_path / "report" / "report.md").read_text().split("## Paired bootstrap")[1]
    assert any(line.startswith("| perfect |") and line.endswith(" * |")
               for line in section.splitlines())  # fmt: skip
    # models made from another baseline (model.json "baseline") are tested against it, or
    # left untested when it has no hypotheses here
    for name, base, hyps in (("first-near", "first", near), ("first", None, refs),
                             ("lost", "gone", refs)):  # fmt: skip
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "test_2016_flickr.hyp").write_text("\n".join(hyps) + "\n")
        bleu = round(BLEU().corpus_score(hyps, [refs]).score, 2)
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": bleu}))
        record = {"method": "scratch"} | ({"baseline": base} if base else {})
        (folder / "model.json").write_text(json.dumps(record))
    report.main(["--work-dir", str(tmp_path), "--tgt", "de"])
    out = json.loads((tmp_path / "report" / "paired_bootstrap.json").read_text())
    models = out["models"]
    assert models["near"]["against"] == "baseline" and models["near"]["p"] > 0.05
    assert models["first-near"]["against"] == "first"  # not the baseline it is near to
    assert models["first-near"]["bleu"] < models["first"]["bleu"] == 100.0
    assert models["first-near"]["p"] < 0.05
    assert out["untested"] == {"lost": "gone"} and "lost" not in models
    section = (tmp_path / "report" / "report.md").read_text().split("## Paired bootstrap")[1]
    row = next(line for line in section.splitlines() if line.startswith("| first-near |"))
    diff = models["first-near"]["bleu"] - 100.0
    assert f"| first | {models['first-near']['bleu']:.2f} | {diff:+.2f} |" in row
    assert "lost (gone)" in section
    # a reference without hypotheses: no test, no section
    for name in ("first-near", "first", "lost"):
        shutil.rmtree(tmp_path / "eval" / name)
    report.main(["--work-dir", str(tmp_path), "--tgt", "de", "--paired-against", "gone"])
    assert "## Paired bootstrap" not in (tmp_path / "report" / "report.md").read_text()
    assert not (tmp_path / "report" / "paired_bootstrap.json").exists()


def test_report_tests_length_buckets_against_the_baseline(tmp_path):
    """BLEU by source length: each bucket's score is sacreBLEU on that bucket's sentences, and
    the paired test within a bucket finds a model that is better only on short sentences
    better there and not on the long ones; a model whose baseline has no hypotheses is not
    tested."""
    from recipes.study import report

    refs, noisy = synthetic_references(tmp_path)
    sources = [" ".join(["word"] * (3 if i % 2 == 0 else 8)) for i in range(len(refs))]
    (tmp_path / "raw" / "test_2016_flickr.en").write_text("\n".join(sources) + "\n")
    short_fixed = [r if i % 2 == 0 else n for i, (r, n) in enumerate(zip(refs, noisy))]
    short_fixed[1] = refs[1]  # and one long sentence: a small difference there
    for name, hyps, record in [
        ("baseline", noisy, {"method": "baseline"}),
        ("short-fixed", short_fixed, {"method": "refit"}),
        ("same", noisy, {"method": "masked"}),
        ("lost", refs, {"method": "scratch", "baseline": "gone"}),
    ]:
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "test_2016_flickr.hyp").write_text("\n".join(hyps) + "\n")
        bleu = round(BLEU().corpus_score(hyps, [refs]).score, 2)
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": bleu}))
        (folder / "model.json").write_text(json.dumps(record))
    report.main(["--work-dir", str(tmp_path), "--tgt", "de", "--length-edges", "5"])
    out = json.loads((tmp_path / "report" / "length_buckets.json").read_text())
    assert out["buckets"] == ["1–5", "> 5"] and out["sentences"] == [30, 30]
    for name, hyps in (("baseline", noisy), ("short-fixed", short_fixed)):
        for k, parity in enumerate((0, 1)):
            part = [i for i in range(len(refs)) if i % 2 == parity]
            bleu = BLEU().corpus_score([hyps[i] for i in part], [[refs[i] for i in part]])
            assert out["bleu"][name][k] == round(bleu.score, 2)
    assert out["against"] == {"short-fixed": "baseline", "same": "baseline"}
    assert 0 < out["bleu"]["short-fixed"][1] - out["bleu"]["baseline"][1] < 3
    p_short, p_long = out["p"]["short-fixed"]
    assert p_short < 0.05 < p_long
    # the baseline's own hypotheses: no difference, p = 1 (sacreBLEU alone says 1/1001)
    assert out["p"]["same"] == [1.0, 1.0]
    section = (tmp_path / "report" / "report.md").read_text().split("## BLEU by source")[1]
    row = next(line for line in section.splitlines() if line.startswith("| short-fixed |"))
    assert row.endswith(f"| 100.00 * | {out['bleu']['short-fixed'][1]:.2f} |")


def test_report_tests_each_control_against_its_pruning_run(tmp_path):
    """Controls are tested against the pruning run with the same heads kept, made from the
    same baseline: a perfect control is significantly ahead, one sentence better is not;
    other head counts, other baselines and controls without hypotheses are not paired."""
    from recipes.study import report
    from recipes.study.significance import format_p

    refs, noisy = synthetic_references(tmp_path)
    full = {"enc-self": [8, 8], "dec-self": [4, 4], "dec-enc": [4, 4]}
    two, three = {**full, "enc-self": [2, 8]}, {**full, "enc-self": [3, 8]}
    for name, record, hyps in [
        ("baseline", {"method": "baseline", "heads": full}, refs),
        ("pruned-k2", {"method": "target-heads", "gated": ["enc-self"], "heads": two}, noisy),
        ("random-s1-k2", {"method": "random", "seed": 1, "heads": two}, refs),
        ("michel-k2", {"method": "michel", "heads": two}, [refs[0]] + noisy[1:]),
        ("lrp-k2", {"method": "lrp", "heads": two}, None),  # not evaluated on the split
        ("random-s1-k3", {"method": "random", "seed": 1, "heads": three}, refs),
        ("first-random-s1-k2", {"method": "random", "heads": two, "baseline": "first"}, refs),
    ]:
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "model.json").write_text(json.dumps(record))
        if hyps is None:
            (folder / "val.json").write_text(json.dumps({"bleu": 1.0}))
            continue
        (folder / "test_2016_flickr.hyp").write_text("\n".join(hyps) + "\n")
        bleu = round(BLEU().corpus_score(hyps, [refs]).score, 2)
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": bleu}))
    report.main(["--work-dir", str(tmp_path), "--tgt", "de"])
    out = json.loads((tmp_path / "report" / "paired_controls.json").read_text())
    pairs = {p["model"]: p for p in out["pairs"]}
    assert set(pairs) == {"random-s1-k2", "michel-k2"}
    assert {p["against"] for p in pairs.values()} == {"pruned-k2"}
    noisy_bleu = round(BLEU().corpus_score(noisy, [refs]).score, 2)
    assert pairs["random-s1-k2"]["against_bleu"] == noisy_bleu
    assert pairs["random-s1-k2"]["bleu"] == 100.0 and pairs["random-s1-k2"]["p"] < 0.05
    assert 0 < pairs["michel-k2"]["bleu"] - noisy_bleu < 2 and pairs["michel-k2"]["p"] > 0.05
    section = (tmp_path / "report" / "report.md").read_text().split("## Controls against")[1]
    row = next(line for line in section.splitlines() if line.startswith("| random-s1-k2 |"))
    p_text = format_p(pairs["random-s1-k2"]["p"])  # sacreBLEU's floor: "< 0.0001"
    assert p_text == "< 0.0001" and row.endswith(f"| {100.0 - noisy_bleu:+.2f} | {p_text} * |")
    # no pruning run with hypotheses: no test, no section, no stale file
    (tmp_path / "eval" / "pruned-k2" / "test_2016_flickr.hyp").unlink()
    report.main(["--work-dir", str(tmp_path), "--tgt", "de"])
    assert "## Controls against" not in (tmp_path / "report" / "report.md").read_text()
    assert not (tmp_path / "report" / "paired_controls.json").exists()


def test_report_averages_best_and_last_checkpoints_apart(tmp_path):
    """Random draws evaluated at their best and at their last checkpoints (controls.sh's
    CONTROL_CHECKPOINT) are two samples: one mean ± sd each, and last ones labelled so."""

    from recipes.study import report

    heads = {"enc-self": [2, 8], "dec-self": [4, 4], "dec-enc": [4, 4]}
    bleu = {("1", ""): 30.0, ("2", ""): 31.0, ("1", "last"): 33.0, ("2", "last"): 36.0}
    for (seed, selected), score in bleu.items():
        folder = tmp_path / "eval" / f"random-s{seed}-k2{'-last' if selected else ''}"
        folder.mkdir(parents=True)
        record = {"method": "random", "seed": int(seed), "heads": heads}
        (folder / "model.json").write_text(
            json.dumps(record | ({"selected": "last"} if selected else {}))
        )
        (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": score}))
    report.main(["--work-dir", str(tmp_path), "--tgt", "de"])
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Random heads")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| baseline")]
    for values, made_from in (
        ([30.0, 31.0], "baseline"),
        ([33.0, 36.0], "baseline, last checkpoints"),
    ):
        m, sd = statistics.mean(values), statistics.stdev(values)
        assert any(
            line.startswith(f"| {made_from} | 2 | 2 | {m:.2f} ± {sd:.2f} |") for line in rows
        )
    assert len(rows) == 2
    row = next(line for line in text.splitlines() if line.startswith("| random-s2-k2-last |"))
    assert "| seed 2, last checkpoint |" in row


def test_full_study_in_one_command(quickstart_work, raw_dir):
    """recipes/full.sh: λ sweep with the encoder-only λ = 0 control, an exact budget, a joint
    run with one budget per attention type and its λ = 0 control, the two-phase protocol,
    controls with the same fine-tuning, and the report."""
    work = quickstart_work  # K = 2: a run of its own (test_prune_… made enc-self-k3)
    _run(
        "full.sh", work, raw_dir, LAMBDAS="0 0.05", TARGETS="2", JOINT_LAMBDAS="0",
        JOINT_TARGETS="enc-self:4,dec-self:2,dec-enc:3",
        TRAIN_BASELINE="1",  # the quickstart's tiny baseline
        CONTROLS="masked random", SEEDS="1", TARGET_WARMUP="2", PRUNE_EPOCHS="8",
        GATE_LR_SCALE="1000",  # gates that close within 8 tiny epochs (32 updates or more)
        PHASE2_EPOCHS="2", PATIENCE="1", PHASE2_SEEDS="1", JOBS="2",  # runs side by side
        SCORE_SENTENCES="20", SUBSETS="test",
    )  # fmt: skip
    # phase 2 of each pruning run, evaluated as <run>-s<seed> with its record
    two_phase = json.loads((work / "eval" / "pruned-k2-s1" / "model.json").read_text())
    assert two_phase["method"] == "two-phase" and two_phase["seed"] == 1
    assert two_phase["checkpoint"].endswith("enc-self-k2/phase2-s1/checkpoint_best.pt")
    # its run folder, whose validation curve recipes.study.publish commits with it
    run_dir = work / "eval" / "pruned-k2-s1" / two_phase["run_dir"]
    assert run_dir.resolve() == (work / "prune" / "enc-self-k2" / "phase2-s1").resolve()
    # an encoder-only run is measured against the encoder-only λ = 0 control, phase by phase
    assert two_phase["reference"] == "pruned-l0-s1"
    encoder_phase1 = json.loads((work / "eval" / "pruned-k2" / "model.json").read_text())
    assert encoder_phase1["reference"] == "pruned-l0"
    encoder_control = json.loads((work / "eval" / "pruned-l0" / "model.json").read_text())
    assert encoder_control["setting"] == "λ=0 (enc-self control), phase 1: 8 epochs"
    assert encoder_control["gated"] == ["enc-self"] and "reference" not in encoder_control
    assert (work / "eval" / "pruned-l0-s1" / "test_2016_flickr.json").exists()
    assert not (work / "eval" / "masked-enc-self-l0-checkpoint_last").exists()  # no controls
    joint_name = "pruned-joint-k4-dec-self2-dec-enc3"  # named by its per-type budget
    assert (work / "eval" / f"{joint_name}-s1" / "test_2016_flickr.json").exists()
    # a joint run is measured against the joint λ = 0 control: phase 2 against the control's
    # phase 2 with the same seed, phase 1 (a record of its own: heads from the gates) against
    # the control's phase 1
    joint_record = json.loads((work / "eval" / f"{joint_name}-s1" / "model.json").read_text())
    assert joint_record["reference"] == "pruned-joint-l0-s1"
    phase1 = json.loads((work / "eval" / joint_name / "model.json").read_text())
    assert phase1["method"] == "target-heads" and phase1["reference"] == "pruned-joint-l0"
    assert phase1["heads"] == {"enc-self": [4, 8], "dec-self": [2, 4], "dec-enc": [3, 4]}
    assert phase1["gated"] == ["enc-self", "dec-self", "dec-enc"]
    control = json.loads((work / "eval" / "pruned-joint-l0" / "model.json").read_text())
    assert "reference" not in control
    assert (work / "eval" / "pruned-joint-l0-s1" / "test_2016_flickr.json").exists()
    control_s1 = json.loads((work / "eval" / "pruned-joint-l0-s1" / "model.json").read_text())
    assert "reference" not in control_s1
    # each phase's setting: the run's budget or λ, then the phase (8 gated epochs, seed 1)
    budget = "target enc-self:4,dec-self:2,dec-enc:3"
    assert phase1["setting"] == f"{budget}, phase 1: 8 epochs"
    assert joint_record["setting"] == f"{budget}, phase 2 (seed 1)"
    assert control["setting"] == "λ=0 (joint control), phase 1: 8 epochs"
    assert control_s1["setting"] == "λ=0 (joint control), phase 2 (seed 1)"
    # the controls got phase 2's fine-tuning: the same epochs, patience and checkpoint rule
    control_log = (work / "controls" / "random-s1-k2" / "train.log").read_text()
    phase2_log = (work / "prune" / "enc-self-k2" / "phase2-s1" / "train.log").read_text()
    for setting in ("'max_epoch': 2", "'patience': 1"):
        assert setting in control_log and setting in phase2_log, setting
    assert not (work / "eval" / "random-s1-k2-last").exists()
    joint = work / "prune" / "joint-k4-dec-self2-dec-enc3"
    assert (joint / "DONE").exists()
    log = (joint / "train.log").read_text()
    assert "head_gates='enc-self,dec-self,dec-enc'" in log and "freeze_decoder=False" in log
    assert "'target_heads': 'enc-self:4,dec-self:2,dec-enc:3'" in log
    report = (work / "report" / "report.md").read_text()
    table = report.split("\n## ")[0]  # the BLEU-vs-heads table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if "|" in line}
    assert "| voita |" in rows["pruned-l0.05"] and "| target-heads |" in rows["pruned-k2"]
    assert "dec-enc" in rows[joint_name]  # the joint run lists the other types
    points = report.split("## Operating points")[1].split("##")[0].splitlines()
    assert any(line.startswith("| full model | baseline |") for line in points)
    joint_point = next(line for line in points if f"| {joint_name} |" in line)
    assert joint_point.startswith("| joint pruning |") and "dec-enc" in joint_point
    budget_point = next(line for line in points if "| pruned-k2 |" in line)
    assert budget_point.startswith("| ~4 encoder heads |")  # 2 of 8: within half of 4
    # controls at the budget of each encoder-only run (k2: the exact-budget run)
    assert (work / "eval" / "random-s1-k2" / "test_2016_flickr.json").exists()
    assert (work / "eval" / "masked-enc-self-k2-checkpoint_last" / "model.json").exists()
    for run in ("enc-self-l0.05", "enc-self-k2", joint.name):
        trajectory = (work / "report" / f"trajectory-{run}.txt").read_text()
        assert "Spearman ρ(lrp, closing update)" in trajectory, run
    scores = json.loads((work / "scores-baseline" / "heads.json").read_text())
    assert {"lrp", "confidence"} <= set(scores["heads"][0])
    # the report's head sections read those scores: the kept heads of the exact-budget run
    gates = subprocess.run(
        [str(BIN / "fairseq-headprune"), "gates", "--json",
         str(work / "prune" / "enc-self-k2" / "checkpoint_last.pt")],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    det = json.loads(gates)["sites"]["enc-self"]["gate"]
    kept = [f"{i}:{h} lrp" for i, row in enumerate(det) for h, g in enumerate(row) if g]
    surviving = report.split("## The surviving heads")[1].split("##")[0]
    row = next(line for line in surviving.splitlines() if line.startswith("| pruned-k2 |"))
    assert row.count(" lrp ") == len(kept) and all(k in row for k in kept), row
    closing = report.split("## When the gates closed")[1]
    assert "| ρ(positional_fraction) |" in closing  # the positional heads' closing order too
    paired = json.loads((work / "report" / "paired_bootstrap.json").read_text())
    assert paired["against"] == "baseline" and "pruned-k2" in paired["models"]
    assert any(line.startswith(f"| {joint_name} |") for line in closing.splitlines())


def test_record_gated_refuses_a_model_without_gates(quickstart_work, tmp_path):
    """A phase-1 record reads the heads from a gated run's gates: a stock model is refused
    with one line naming it, and nothing is written."""
    baseline = quickstart_work / "baseline" / "checkpoint_best.pt"
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.controls", "record-gated",
         "--eval-dir", str(tmp_path / "eval"), "--checkpoint", str(baseline)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("has no head gates (not a gated run)")
    assert not (tmp_path / "eval").exists()


def test_report_from_committed_files(quickstart_work, tmp_path):
    """The run folder gone: a report from what a study commits (evaluations, hypotheses,
    model.json records, the gate trajectory) and the raw text elsewhere (--raw-dir) has the
    full study's surviving heads, closing order, length buckets and paired tests; a run made
    from another baseline is left out of the head sections (the scores are not its model's)."""
    from recipes.study import records, report
    from recipes.study.heads import heads_markdown

    work = quickstart_work  # after test_full_study_in_one_command: its report is there
    rows = {r["name"]: r for r in records.collect(work, {})}
    committed = tmp_path / "committed"
    (committed / "prune" / "enc-self-k2").mkdir(parents=True)
    shutil.copy(work / "prune" / "enc-self-k2" / "gate_trajectory.jsonl",
                committed / "prune" / "enc-self-k2")  # fmt: skip
    gone = str(tmp_path / "gone" / "checkpoint_last.pt")
    for name in ("baseline", "pruned-k2", "first-pruned-k2"):
        row = rows[name.removeprefix("first-")]
        folder = committed / "eval" / name
        folder.mkdir(parents=True)
        for f in (work / "eval" / row["name"]).glob("*.*"):
            if f.suffix in (".json", ".hyp") and f.name != "model.json":
                shutil.copy(f, folder)
        record = {"method": row["method"], "checkpoint": gone, "heads": row["heads"],
                  "gated": row["gated"], "kept_heads": row["kept"]}  # fmt: skip
        if name != "baseline":
            record["run_dir"] = "../../prune/enc-self-k2"
        if name.startswith("first-"):  # the same files, said to be made from another model
            record["baseline"] = "first-baseline"
        (folder / "model.json").write_text(json.dumps(record))
    report.main([
        "--work-dir", str(committed), "--raw-dir", str(work / "raw"),
        "--scores", str(work / "scores-baseline" / "heads.json"),
    ])  # fmt: skip
    original = (work / "report" / "report.md").read_text()
    text = (committed / "report" / "report.md").read_text()

    def section(md: str, title: str) -> dict[str, str]:
        body = md.split(f"## {title}")[1].split("\n## ")[0]
        return {ln.split("|")[1].strip(): ln for ln in body.splitlines() if ln.startswith("| ")}

    surviving = section(text, "The surviving heads")
    assert surviving["pruned-k2"] == section(original, "The surviving heads")["pruned-k2"]
    assert "first-pruned-k2" not in surviving
    closing, closing_before = (
        section(text, "When the gates closed"),
        section(original, "When the gates closed"),
    )
    assert "first-pruned-k2" not in closing
    # without checkpoint_last.pt the snapshots are the recorded ones; the closing order is
    # the same (no gate closed after the last record)
    ours, theirs = closing["pruned-k2"].split("|"), closing_before["pruned-k2"].split("|")
    assert ours[3:] == theirs[3:] and 0 <= int(theirs[2]) - int(ours[2]) <= 1
    for title in ("BLEU by source length", "Paired bootstrap against the baseline"):
        assert section(text, title)["pruned-k2"] == section(original, title)["pruned-k2"]
    # the first baseline's own report: its records name it first-baseline, as its copies do
    for name in ("baseline", "pruned-k2"):
        record = json.loads((committed / "eval" / name / "model.json").read_text())
        record["baseline"] = "first-baseline"
        (committed / "eval" / name / "model.json").write_text(json.dumps(record))
    scores = json.loads((work / "scores-baseline" / "heads.json").read_text())
    lines = heads_markdown(records.collect(committed, {}), scores)
    assert surviving["pruned-k2"] in lines  # and now first-pruned-k2, of the same baseline
    assert any(ln.startswith("| first-pruned-k2 |") for ln in lines)
    with pytest.raises(SystemExit):  # a --raw-dir that is not there is an error, not no rows
        report.main(["--work-dir", str(committed), "--raw-dir", str(tmp_path / "none")])


def test_report_reads_a_committed_study(tmp_path):
    """The report of a committed study folder (results/multi30k-en-de/prenorm-b: gzipped
    hypotheses, model records, the gate trajectory, the baseline's head scores), its run
    folder gone: every row, the control paired with the pruning run of the same heads."""
    if not SHARED.is_dir():
        pytest.skip("needs the Multi30k test sets the committed hypotheses were scored on")
    from recipes.study import report

    committed = REPO / "results" / "multi30k-en-de" / "prenorm-b"
    study = tmp_path / "study"
    for part in ["eval/baseline", "eval/pruned-k4", "eval/random-s2-k4-last", "prune/enc-self-k4",
                 "scores-baseline"]:  # fmt: skip
        shutil.copytree(committed / part, study / part)
    scores = study / "scores-baseline" / "heads.json"
    report.main([
        "--work-dir", str(study), "--raw-dir", str(SHARED), "--scores", str(scores),
        "--out-dir", str(tmp_path / "out"),
    ])  # fmt: skip
    text = (tmp_path / "out" / "report.md").read_text()
    last = committed / "eval" / "random-s2-k4-last"
    splits = ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
    bleu = [str(json.loads((last / f"{s}.json").read_text())["bleu"]) for s in splits]
    row = next(line for line in text.splitlines() if line.startswith("| random-s2-k4-last |"))
    assert (
        row
        == f"| random-s2-k4-last | random | seed 2, last checkpoint | 4/48 | {' | '.join(bleu)} |"
    )
    pairs = json.loads((tmp_path / "out" / "paired_controls.json").read_text())["pairs"]
    assert [(p["model"], p["against"]) for p in pairs] == [("random-s2-k4-last", "pruned-k4")]
    refs = (SHARED / "test_2016_flickr.de").read_text().splitlines()
    hyps = gzip.decompress((last / "test_2016_flickr.hyp.gz").read_bytes()).decode().splitlines()
    assert pairs[0]["bleu"] == round(BLEU().corpus_score(hyps, [refs]).score, 2)
    assert "## The surviving heads" in text and "## When the gates closed" in text


def test_report_differences_are_to_each_models_own_baseline(tmp_path):
    """Models made from another baseline (model.json "baseline") are compared with it."""
    from recipes.study import records, tables

    full = {"enc-self": [48, 48], "dec-self": [24, 24], "dec-enc": [24, 24]}
    for name, bleu, record in [
        ("baseline", 38.0, {"method": "baseline"}),
        ("pruned-k4", 36.5, {"method": "target-heads", "gated": ["enc-self"],
                             "heads": {**full, "enc-self": [4, 48]}}),
        ("first-baseline", 40.0, {"method": "baseline", "baseline": "first-baseline"}),
        ("first-pruned-k10", 39.0, {"method": "target-heads", "gated": ["enc-self"],
                                    "heads": {**full, "enc-self": [10, 48]},
                                    "baseline": "first-baseline"}),
        *[(name, bleu, {"method": "random", "heads": {**full, "enc-self": [4, 48]}, **base})
          for name, bleu, base in [("random-s1-k4", 37.0, {}), ("random-s2-k4", 38.0, {}),
                                   ("first-random-s1-k4", 40.0, {"baseline": "first-baseline"})]],
    ]:  # fmt: skip
        folder = tmp_path / "eval" / name
        folder.mkdir(parents=True)
        (folder / "val.json").write_text(json.dumps({"bleu": bleu}))
        record.setdefault("heads", full)
        (folder / "model.json").write_text(json.dumps(record))
    table = tables.operating_points(records.collect(tmp_path, {}), ["val"])
    cells = {line.split(" | ")[1]: line.split(" | ")[-1] for line in table if "| " in line}
    assert cells["pruned-k4"] == "36.50 (-1.50) |"
    assert cells["first-pruned-k10"] == "39.00 (-1.00) |"
    assert cells["baseline"] == "38.00 |" and cells["first-baseline"] == "40.00 |"
    # random seeds: a mean per baseline, not one over both
    tables.write_markdown(records.collect(tmp_path, {}), ["val"], tmp_path / "report.md")
    means = (tmp_path / "report.md").read_text().split("## Random heads")[1].split("##")[0]
    assert "| baseline | 4 | 2 | 37.50 ± 0.71 |" in means
    assert "| first-baseline | 4 | 1 | 40.00 (1 seed) |" in means


def test_report_plots_joint_runs_apart_from_encoder_only_ones(tmp_path, monkeypatch):
    """The plot's x axis counts encoder heads: a joint run (decoder pruned too) is its own
    series, not a point on the encoder-only curve."""
    from recipes.study import plot, records

    full = {"enc-self": [48, 48], "dec-self": [24, 24], "dec-enc": [24, 24]}
    rows = [
        {"name": "enc", "method": "voita", "heads": {**full, "enc-self": [7, 48]},
         "gated": ["enc-self"], "bleu": {"test_2016_flickr": 32.0}},
        {"name": "joint", "method": "voita", "gated": ["enc-self", "dec-self", "dec-enc"],
         "heads": {"enc-self": [4, 48], "dec-self": [11, 24], "dec-enc": [10, 24]},
         "bleu": {"test_2016_flickr": 33.0}},
        {"name": "masked", "method": "masked", "bleu": {"test_2016_flickr": 17.0},
         "heads": {"enc-self": [4, 48], "dec-self": [11, 24], "dec-enc": [10, 24]}},
        {"name": "first-enc", "method": "voita", "heads": {**full, "enc-self": [10, 48]},
         "gated": ["enc-self"], "bleu": {"test_2016_flickr": 32.5}, "baseline": "first"},
    ]  # fmt: skip
    assert [records.is_joint(r) for r in rows] == [False, True, True, False]
    from matplotlib.figure import Figure

    legends = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        legends.append([t.get_text() for t in fig.axes[0].get_legend().get_texts()])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    plot.plot(rows, "test_2016_flickr", tmp_path / "plot.png")
    assert len(legends) == 1
    assert sorted(legends[0]) == ["masked (joint)", "voita", "voita (joint)", "voita, first"]
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_report_shows_how_far_training_got(tiny_data, tmp_path):
    """The validation curve of a real fairseq-train log, resumed once (the log appended to, as
    train_baseline.sh does): epochs, updates and best nll agree with the checkpoint."""
    from recipes.study import records, training

    save = tmp_path / "baseline"
    for epochs in ("2", "4"):  # the second run resumes from checkpoint_last.pt
        proc = cli(
            "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "transformer",
            *TINY_ARCH, *TRAIN_COMMON, "--save-dir", save, "--max-epoch", epochs,
            "--criterion", "label_smoothed_cross_entropy", "--best-checkpoint-metric", "nll_loss",
        )  # fmt: skip
        with open(save / "train.log", "a") as f:
            f.write(proc.stdout + proc.stderr)
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    curve = training.validation_curve(save / "train.log")
    assert [c[0] for c in curve] == [1, 2, 3, 4]
    assert curve[-1][1] == state["optimizer_history"][-1]["num_updates"]
    assert min(c[2] for c in curve) == round(state["extra_state"]["best"], 3)
    row = {"name": "baseline", "method": "baseline", "checkpoint": str(save / "x.pt")}
    lines = training.training_markdown([row, dict(row, name="pruned", method="voita")], last=3)
    table = [line for line in lines if line.startswith("| baseline |")]
    cells = [c.strip() for c in table[0].split("|")]
    assert cells[2:4] == ["4", str(curve[-1][1])] and len(lines) == 9
    assert cells[5].split() == [f"{c[2]:.3f}" for c in curve[-3:]]
    assert cells[6] == f"{curve[-1][2] - curve[-3][2]:+.3f}"
    best = torch.load(save / "checkpoint_best.pt", weights_only=False)
    updates = best["optimizer_history"][-1]["num_updates"]
    epoch = next(c[0] for c in curve if c[1] == updates)
    assert cells[4] == f"{best['extra_state']['best']:.3f} (epoch {epoch})"
    # without the checkpoint lines: the lowest printed nll, the later epoch on a tie
    log = tmp_path / "valid-only.log"
    text = (save / "train.log").read_text().splitlines()
    log.write_text("\n".join(ln for ln in text if "Saved checkpoint" not in ln))
    ties = [(1, 10, 2.5), (2, 20, 2.25), (3, 30, 2.25), (4, 40, 2.375)]
    assert training.best_epoch(log, ties) == (3, 30, 2.25)
    # the run folder gone: the epoch lines a study commits, named by the model.json
    work = tmp_path / "work"
    (work / "eval" / "first-baseline").mkdir(parents=True)
    (work / "eval" / "first-baseline" / "val.json").write_text('{"bleu": 30.0}')
    epochs = [ln for ln in text if re.search(r"Loaded checkpoint|\| (valid|train) \| epoch", ln)]
    (work / "baseline-epochs.log").write_text("\n".join(epochs) + "\n")
    record = {"method": "baseline", "checkpoint": str(tmp_path / "gone" / "checkpoint_best.pt")}
    record["train_log"] = "../../baseline-epochs.log"
    (work / "eval" / "first-baseline" / "model.json").write_text(json.dumps(record))
    # a run stopped and resumed: its logs in order (the second from the resume on)
    resumed = next(i for i, ln in enumerate(epochs) if "Loaded checkpoint" in ln)
    (work / "eval" / "first-scratch").mkdir()
    (work / "eval" / "first-scratch" / "val.json").write_text('{"bleu": 30.0}')
    for i, part in enumerate((epochs[:resumed], epochs[resumed:])):
        (work / f"part{i}.log").write_text("\n".join(part) + "\n")
    record = dict(record, method="scratch", train_log=["../../part0.log", "../../part1.log"])
    (work / "eval" / "first-scratch" / "model.json").write_text(json.dumps(record))
    committed = training.training_markdown(records.collect(work, {}), last=3)
    for name in ("first-baseline", "first-scratch"):
        row = [line for line in committed if line.startswith(f"| {name} |")]
        assert row and row[0].split("|")[2:] == table[0].split("|")[2:]
    (work / "part0.log").unlink()  # a partial curve is not shown
    committed = training.training_markdown(records.collect(work, {}), last=3)
    assert [ln.split("|")[1].strip() for ln in committed if ln.startswith("| first")] == [
        "first-baseline"
    ]


def test_evaluate_with_a_length_penalty(quickstart_work, raw_dir):
    """LENPEN reaches fairseq-generate, is recorded, and a NAME keeps one length penalty."""
    work = quickstart_work
    ckpt = str(work / "baseline" / "checkpoint_best.pt")
    _run("evaluate.sh", work, raw_dir, "baseline-lp3", ckpt, LENPEN="3", SUBSETS="test")
    out = work / "eval" / "baseline-lp3"
    assert (out / "lenpen").read_text().strip() == "3"
    scores = {  # fairseq divides a hypothesis' log-probability by its length ** lenpen
        name: [
            abs(float(line.split("\t")[1]))
            for line in (work / "eval" / name / "test_2016_flickr.gen").read_text().splitlines()
            if line.startswith("H-")
        ]
        for name in ("baseline", "baseline-lp3")
    }
    assert len(scores["baseline-lp3"]) == 20
    assert sum(scores["baseline-lp3"]) < sum(scores["baseline"]) / 4, scores
    proc = _recipe("evaluate.sh", work, raw_dir, "baseline-lp3", ckpt, SUBSETS="test")
    assert proc.returncode != 0 and "scored with LENPEN=3, not 1" in proc.stderr


def test_posttrain_curve_with_fine_tuning_and_published_records(quickstart_work, raw_dir, tmp_path):
    """recipes/posttrain.sh: prune without retraining, evaluate, bench, record; with FT_EPOCHS
    fine-tune each pruned model and the full one alike (its fair reference); RESULTS: copy
    every evaluation with its run's records into a results tree that the summary reads."""
    results = tmp_path / "results"
    study = results / "multi30k-en-de" / "study"
    work = tmp_path / "work"  # the quickstart's data, evaluations of its own
    work.mkdir()
    for shared in ("raw", "data-bin"):
        (work / shared).symlink_to(quickstart_work / shared)
    env = {"BUDGETS": "macs:0.7",
           "CALIBRATION": "40", "SUBSETS": "valid test", "BENCH_BATCHES": "4",
           "BENCH_SENTENCES": "8", "FT_EPOCHS": "1", "RESULTS": str(study),
           "RUNS_DIR": str(tmp_path / "posttrain")}  # fmt: skip
    baseline = quickstart_work / "baseline" / "checkpoint_best.pt"
    _run("posttrain.sh", work, raw_dir, str(baseline), **env)
    names = {p.name for p in (study / "eval").iterdir()}
    assert names == {"posttrain-macs0.7", "posttrain+ft-macs0.7-s1", "finetuned-1ep-s1"}
    ft = json.loads((study / "eval" / "posttrain+ft-macs0.7-s1" / "model.json").read_text())
    assert (ft["method"], ft["reference"], ft["seed"]) == ("posttrain+ft", "finetuned-1ep-s1", 1)
    assert (tmp_path / "posttrain" / "macs0.7" / "ft-s1" / "bench.json").is_file()  # its own speed
    ft_dir = study / "eval" / "posttrain+ft-macs0.7-s1"
    assert (ft_dir / ft["bench"]).is_file() and ft["bench"].endswith("s1.bench.json")
    ref = json.loads((study / "eval" / "finetuned-1ep-s1" / "model.json").read_text())
    assert ref["heads"]["enc-self"] == [8, 8] and ref["reference"] == "baseline"
    pruned = study / "eval" / "posttrain-macs0.7"
    record = json.loads((pruned / "model.json").read_text())
    assert (pruned / record["run_dir"] / "prune.json").is_file()
    assert (pruned / record["run_dir"] / "bench.json").is_file() and record["speedup"]["4"] > 0
    assert (pruned / "test_2016_flickr.hyp.gz").is_file()
    # the fine-tuned models trained every parameter, from the pruned / full weights
    runs = tmp_path / "posttrain"
    for run in (runs / "macs0.7" / "ft-s1", runs / "full-ft1-s1"):
        log = (run / "train.log").read_text()
        assert "head_gates='none'" in log and "freeze_decoder=False" in log
        assert (run / "DONE").exists()
    assert (
        "kept_heads='" in (tmp_path / "posttrain" / "macs0.7" / "ft-s1" / "train.log").read_text()
    )


def test_posttrain_heads_of_one_type_against_michel(quickstart_work, raw_dir, tmp_path):
    """recipes/posttrain.sh SITES=enc-self MICHEL=1: heads:K of encoder self-attention only,
    and Michel et al.'s iterative importance at the same heads per type, both without
    retraining, each evaluated and recorded; BENCH_BATCHES empty: no bench. FT_EPOCHS with
    FT_FREEZE_DECODER=1: both, and the full model, fine-tuned as a gated run (encoder only,
    last checkpoint)."""
    work = tmp_path / "work"
    work.mkdir()
    for shared in ("raw", "data-bin"):
        (work / shared).symlink_to(quickstart_work / shared)
    runs = tmp_path / "posttrain"
    env = {"BUDGETS": "heads:3", "SITES": "enc-self", "MICHEL": "1", "CALIBRATION": "40",
           "SUBSETS": "test", "BENCH_BATCHES": "", "RUNS_DIR": str(runs), "FT_EPOCHS": "1",
           "FT_FREEZE_DECODER": "1"}  # fmt: skip
    baseline = quickstart_work / "baseline" / "checkpoint_best.pt"
    _run("posttrain.sh", work, raw_dir, str(baseline), **env)
    ours = json.loads((work / "eval" / "posttrain-heads3-enc-self" / "model.json").read_text())
    michel = json.loads((work / "eval" / "michel-heads3-enc-self" / "model.json").read_text())
    steps = "3 search steps, units reselected, weights refit"  # prune's defaults
    assert ours["setting"] == f"heads:3 of enc-self, {steps}, no retraining"
    assert michel["method"] == "michel" and michel["setting"] == "no retraining"
    # TINY: 2 encoder and 1 decoder layers of 4 heads; only encoder self-attention pruned
    assert (
        ours["heads"]
        == michel["heads"]
        == {"enc-self": [3, 8], "dec-self": [4, 4], "dec-enc": [4, 4]}
    )
    kept = json.loads((runs / "heads3-enc-self" / "michel" / "pruned.pt.heads.json").read_text())
    assert sum(map(len, kept["enc-self"])) == 3
    assert (work / "eval" / "michel-heads3-enc-self" / "test_2016_flickr.json").is_file()
    assert not list(runs.rglob("bench.json"))
    for name, method in (("posttrain+ft-heads3-enc-self-enc-s1", "posttrain+ft"),
                         ("michel+ft-heads3-enc-self-enc-s1", "michel")):  # fmt: skip
        record = json.loads((work / "eval" / name / "model.json").read_text())
        assert (record["method"], record["reference"]) == (method, "finetuned-1ep-enc-s1")
        assert record["checkpoint"].endswith("-enc-s1/checkpoint_last.pt"), record["checkpoint"]
        assert "encoder only" in record["setting"]
    ft = json.loads(
        (work / "eval" / "posttrain+ft-heads3-enc-self-enc-s1" / "model.json").read_text()
    )
    assert ft["setting"] == f"heads:3 of enc-self, {steps}, 1 epochs, encoder only"
    ref = json.loads((work / "eval" / "finetuned-1ep-enc-s1" / "model.json").read_text())
    assert ref["setting"] == "fine-tuned 1 epochs, encoder only"
    for run in (runs / "full-ft1-enc-s1", runs / "heads3-enc-self" / "ft-enc-s1"):
        assert "freeze_decoder=True" in (run / "train.log").read_text()
