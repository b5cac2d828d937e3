"""recipes/posttrain.sh: post-training pruning without retraining, with fine-tuning, against
Michel et al., evaluated, benched and published."""

import json

from tests.recipe_helpers import run_recipe


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
    run_recipe("posttrain.sh", work, raw_dir, str(baseline), **env)
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
    run_recipe("posttrain.sh", work, raw_dir, str(baseline), **env)
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
