"""Every recipe script, as the README runs them, on a few hundred real Multi30k sentences: the
quickstart, pruning, the controls, the report, evaluation."""

import json
import os
import subprocess
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from tests.helpers import BIN, REPO
from tests.recipe_helpers import recipe, run_recipe


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
    again = run_recipe("quickstart.sh", tmp_path, raw_dir, TARGET_HEADS="5", TARGET_WARMUP="2")
    assert again.splitlines()[-4:] == out.splitlines()[-4:]
    # TARGET_HEADS= (empty): a λ instead of a head budget
    by_lambda = run_recipe("quickstart.sh", tmp_path, raw_dir, TARGET_HEADS="")
    assert by_lambda.split("BLEU test_2016_flickr\n")[1].splitlines()[1].startswith("pruned-l0.05")
    assert "'l0_lambda': 0.05" in (tmp_path / "prune" / "enc-self-l0.05" / "train.log").read_text()


def test_evaluate_refuses_incomplete_output(raw_dir, tmp_path):
    run_recipe("prepare.sh", tmp_path, raw_dir)
    gen = tmp_path / "partial.gen"
    gen.write_text("D-0\t-0.5\tein hund\n")
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "recipes.study.bleu", str(gen),
         str(tmp_path / "raw" / "test_2016_flickr.de")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0 and "1 hypotheses for 20 references" in proc.stderr


def test_prune_with_an_exact_head_budget(quickstart_work, raw_dir):
    work = quickstart_work
    run_recipe("prune.sh", work, raw_dir, TARGET_HEADS="3", TARGET_WARMUP="2", MAX_EPOCH="2")
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
    run_recipe("controls.sh", work, raw_dir, **settings)
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
    run_recipe("controls.sh", work, raw_dir, **dict(settings, CONTROLS="michel lrp"))
    # any checkpoint under a name of one's own: evaluate.sh records it for the report
    run_recipe("evaluate.sh", work, raw_dir, "my-export", str(structure), SUBSETS="test")
    assert (work / "eval" / "my-export" / "checkpoint").read_text().strip() == str(structure)
    other = str(work / "baseline" / "checkpoint_best.pt")  # a second model under that name
    proc = recipe("evaluate.sh", work, raw_dir, "my-export", other, SUBSETS="test")
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
    run_recipe("train_baseline.sh", tmp_path, raw_dir, MAX_EPOCH="1", NORM="post")
    baseline = tmp_path / "baseline" / "checkpoint_best.pt"
    state = torch.load(baseline, weights_only=False)
    args = state["cfg"]["model"]
    assert not args.encoder_normalize_before and not args.decoder_normalize_before
    assert not {"encoder.layer_norm.weight", "decoder.layer_norm.weight"} & set(state["model"])
    # MAX_EPOCH=<the epoch reached> ends an unfinished run where it is (how a baseline stopped
    # by the validation-BLEU rule gets its DONE): fairseq-train resumes, trains no epoch
    (tmp_path / "baseline" / "DONE").unlink()
    run_recipe("train_baseline.sh", tmp_path, raw_dir, MAX_EPOCH="1", NORM="post")
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
    # no SCRATCH_EPOCHS: the control trains as many epochs as the baseline's run (1); the
    # fine-tunings' PATIENCE does not stop it early
    proc = recipe("controls.sh", tmp_path, raw_dir, BASELINE=str(baseline),
                   PRUNED=str(structure), CONTROLS="scratch", SUBSETS="test",
                   PATIENCE="1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "from scratch for 1 epochs, as many as the baseline" in proc.stderr
    scratch_log = (tmp_path / "controls" / "scratch-structure3" / "train.log").read_text()
    assert "| INFO | train | epoch 001 |" in scratch_log and "epoch 002" not in scratch_log
    assert "'patience': 0" in scratch_log and "'patience': 1" not in scratch_log
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
    assert record["run_dir"] == "../../controls/scratch-structure3"  # published with it
    del record["run_dir"]
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
    proc = recipe("train_baseline.sh", tmp_path, raw_dir, BASELINE_DIR=str(tmp_path / "x"),
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
    run_recipe("controls.sh", work, raw_dir, **settings, BUDGET="3", SEEDS="7")
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
    run_recipe(
        "controls.sh", work, raw_dir, **settings, BUDGET="enc-self:3", CONTROLS="random", SEEDS="7"
    )
    assert (run / "train.log").read_text() == before
    # the same run's last checkpoint (a pruning run's rule), evaluated apart: nothing retrained;
    # given as the phase-2 budget of a two-phase run, which is its fair reference
    run_recipe("controls.sh", work, raw_dir, **settings, BUDGET="3", CONTROLS="random", SEEDS="7",
         CONTROL_CHECKPOINT="last", PHASE2_OF="pruned-k3-s1")  # fmt: skip
    assert (run / "train.log").read_text() == before
    last = work / "eval" / "random-s7-k3-last"
    assert (last / "checkpoint").read_text().strip() == str((run / "checkpoint_last.pt").resolve())
    record = json.loads((last / "model.json").read_text())
    assert (record["method"], record["seed"], record["selected"]) == ("random", 7, "last")
    assert (record["setting"], record["reference"]) == ("phase-2 budget, seed 7", "pruned-k3-s1")
    assert (last / record["run_dir"]).resolve() == run.resolve()
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
        proc = recipe("controls.sh", work, raw_dir, **{**settings, **extra})
        assert proc.returncode != 0 and message in proc.stderr, (extra, proc.stderr[-1000:])


def test_evaluate_with_a_length_penalty(quickstart_work, raw_dir):
    """LENPEN reaches fairseq-generate, is recorded, and a NAME keeps one length penalty."""
    work = quickstart_work
    ckpt = str(work / "baseline" / "checkpoint_best.pt")
    run_recipe("evaluate.sh", work, raw_dir, "baseline-lp3", ckpt, LENPEN="3", SUBSETS="test")
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
    proc = recipe("evaluate.sh", work, raw_dir, "baseline-lp3", ckpt, SUBSETS="test")
    assert proc.returncode != 0 and "scored with LENPEN=3, not 1" in proc.stderr
