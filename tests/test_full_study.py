"""recipes/full.sh, the whole study in one command, and the report made from what a study
commits."""

import gzip
import json
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU

from tests.helpers import BIN, REPO
from tests.recipe_helpers import SHARED, recipe, run_recipe


def test_full_study_in_one_command(quickstart_work, raw_dir):
    """recipes/full.sh: λ sweep with the encoder-only λ = 0 control, an exact budget, a joint
    run with one budget per attention type and its λ = 0 control, the two-phase protocol,
    controls with the same fine-tuning, and the report."""
    work = quickstart_work  # K = 2: a run of its own (test_prune_… made enc-self-k3)
    run_recipe(
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
    # phase 2 recorded from the committed phase-1 record (the gated checkpoint gone) reads alike
    for run, phase2 in ((joint_name, joint_record), ("pruned-joint-l0", control_s1)):
        again = work / "eval" / f"{run}-again"
        kept = Path(phase2["checkpoint"]).parents[1] / "pruned.pt.heads.json"
        subprocess.run(
            [str(BIN / "python"), "-m", "recipes.study.controls", "record",
             "--eval-dir", str(again), "--method", "two-phase",
             "--checkpoint", phase2["checkpoint"], "--kept", str(kept),
             "--seed", "1", "--phase2-of", str(work / "eval" / run / "model.json")],
            check=True, capture_output=True, cwd=REPO,
        )  # fmt: skip
        assert json.loads((again / "model.json").read_text())["setting"] == phase2["setting"]
        shutil.rmtree(again)
    # the controls got phase 2's fine-tuning: the same epochs, patience and checkpoint rule
    control_log = (work / "controls" / "random-s1-k2" / "train.log").read_text()
    phase2_log = (work / "prune" / "enc-self-k2" / "phase2-s1" / "train.log").read_text()
    for setting in ("'max_epoch': 2", "'patience': 1"):
        assert setting in control_log and setting in phase2_log, setting
    assert not (work / "eval" / "random-s1-k2-last").exists()
    # and are measured against phase 2 with the same fine-tuning seed
    random_record = json.loads((work / "eval" / "random-s1-k2" / "model.json").read_text())
    assert random_record["setting"] == "phase-2 budget, seed 1"
    assert random_record["reference"] == "pruned-k2-s1"
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


def test_an_interrupted_fine_tuning_resumes_as_the_uninterrupted_run(quickstart_work, raw_dir):
    """Phase 2 and the controls' fine-tuning (finetune_pruned.sh) stop by fairseq's
    --patience, whose counter the checkpoint does not keep: an interrupted run resumes one
    epoch at a time and ends after the epoch where a run that was never interrupted ends."""
    work = quickstart_work
    folder = work / "resume"
    folder.mkdir()
    mask = folder / "keep3.json"
    mask.write_text(json.dumps({"enc-self": [[1], [0, 3]]}))
    pruned = folder / "pruned.pt"
    subprocess.run(
        [str(BIN / "fairseq-headprune"), "export", "--mask", str(mask), "--out", str(pruned),
         "--path", str(work / "baseline" / "checkpoint_best.pt")],
        check=True, capture_output=True,
    )  # fmt: skip
    finetune = partial(run_recipe, "finetune_pruned.sh", work, raw_dir, PATIENCE="2")
    finetune(str(folder / "whole"), str(pruned), MAX_EPOCH="3")
    finetune(str(folder / "split"), str(pruned), MAX_EPOCH="1")  # as if stopped after epoch 1
    (folder / "split" / "DONE").unlink()
    resume = partial(recipe, "finetune_pruned.sh", work, raw_dir, str(folder / "split"),
                     str(pruned), PATIENCE="2", MAX_EPOCH="3")  # fmt: skip
    proc = resume()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch 2 of at most 3 (patience 2)" in proc.stderr
    assert "epoch 3 of at most 3 (patience 2)" in proc.stderr
    # the same epochs and updates as the uninterrupted run (not bit-identical weights: fairseq
    # groups the sentences into batches anew when it starts, seeded by the starting epoch)
    states = [torch.load(folder / run / "checkpoint_last.pt", weights_only=False)
              for run in ("whole", "split")]  # fmt: skip
    assert [s["extra_state"]["train_iterator"]["epoch"] for s in states] == [4, 4]
    updates = [s["optimizer_history"][-1]["num_updates"] for s in states]
    assert updates[0] == updates[1] > 0
    # once complete (max epochs or patience), a resumed run trains nothing
    (folder / "split" / "DONE").unlink()
    again = resume()
    assert again.returncode == 0 and "resuming" not in again.stderr
    assert (folder / "split" / "DONE").exists()


def test_an_interrupted_baseline_with_patience_resumes_one_epoch_at_a_time(
    quickstart_work, raw_dir, tmp_path
):
    """train_baseline.sh's PATIENCE stops the baseline by the same rule: the first call gives
    fairseq-train --patience, an interrupted run resumes one epoch at a time (--patience 0)
    until the rule (or MAX_EPOCH) ends it."""
    for name in ("data-bin", "raw"):
        (tmp_path / name).symlink_to(quickstart_work / name)
    train = partial(recipe, "train_baseline.sh", tmp_path, raw_dir, PATIENCE="2")
    proc = train(MAX_EPOCH="1")  # as if stopped after epoch 1
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "baseline"
    (run / "DONE").unlink()
    proc = train(MAX_EPOCH="3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch 2 of at most 3 (patience 2)" in proc.stderr
    assert "epoch 3 of at most 3 (patience 2)" in proc.stderr
    log = (run / "train.log").read_text()
    assert log.count("'patience': 2") == 1 and log.count("'patience': 0") == 2
    state = torch.load(run / "checkpoint_last.pt", weights_only=False)
    assert state["extra_state"]["train_iterator"]["epoch"] == 4  # 3 epochs complete
    assert (run / "DONE").exists()


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
