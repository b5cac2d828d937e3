"""results/summary.csv (recipes/study/summary.py): one row per evaluated model, each BLEU
recomputed with sacreBLEU from the committed hypotheses and checked against the JSON."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from recipes.study import summary
from recipes.study.significance import format_p
from tests.helpers import REPO, valid_log_line
from tests.recipe_helpers import SHARED

WORDS = "ein hund rennt über die grüne wiese am see neben zwei kindern".split()
REFS = [" ".join(WORDS[i % 5 : i % 5 + 6] + [str(i)]) for i in range(60)]
SHORT = [" ".join(r.split()[: 3 + i % 3]) for i, r in enumerate(REFS)]  # too short: BP < 1
NEAR = [REFS[0]] + SHORT[1:]
FULL = {"enc-self": [8, 8], "dec-self": [4, 4], "dec-enc": [4, 4]}


def evaluation(study: Path, name: str, hyps: list[str], record: dict, gz: bool = False) -> Path:
    """eval/NAME/ as evaluate.sh writes it (test_2016_flickr only), with its model.json."""
    folder = study / "eval" / name
    folder.mkdir(parents=True)
    text = ("\n".join(hyps) + "\n").encode()
    if gz:
        (folder / "test_2016_flickr.hyp.gz").write_bytes(gzip.compress(text))
    else:
        (folder / "test_2016_flickr.hyp").write_bytes(text)
    bleu = BLEU()
    result = {"bleu": round(bleu.corpus_score(hyps, [REFS]).score, 2), "sentences": len(hyps)}
    (folder / "test_2016_flickr.json").write_text(json.dumps(result))
    (folder / "model.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path]:
    """results/toy-en-de/base/ with a baseline, a pruned model, its fair reference (a model
    fine-tuned as long, named by model.json "reference") and a perfect model."""
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "test_2016_flickr.de").write_text("\n".join(REFS) + "\n")
    study = tmp_path / "results" / "toy-en-de" / "base"
    two = {**FULL, "enc-self": [2, 8]}
    evaluation(study, "baseline", SHORT, {"method": "baseline", "heads": FULL})
    evaluation(study, "finetuned", SHORT, {"method": "voita", "setting": "λ=0", "heads": FULL})
    record = {"method": "target-heads", "heads": two, "gated": ["enc-self"], "seed": 2,
              "reference": "finetuned", "checkpoint": "/gone/checkpoint_last.pt"}  # fmt: skip
    evaluation(study, "pruned-k2", NEAR, record, gz=True)
    evaluation(study, "perfect", REFS, {"method": "scratch", "heads": two})
    return tmp_path / "results", refs


def rows(results: Path, refs: Path, *extra: str) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary.main([str(results), "--refs", str(refs), *extra])
    return list(csv.DictReader(io.StringIO(out.getvalue())))


def test_rows_are_recomputed_from_the_hypotheses(tree):
    results, refs = tree
    table = {r["model"]: r for r in rows(results, refs)}
    assert list(table) == ["baseline", "finetuned", "perfect", "pruned-k2"]
    for name, hyps in (("baseline", SHORT), ("pruned-k2", NEAR), ("perfect", REFS)):
        score = BLEU().corpus_score(hyps, [REFS])
        row = table[name]
        assert float(row["test_2016_flickr"]) == round(score.score, 2)
        assert float(row["bp_test_2016_flickr"]) == round(score.bp, 4)
        assert float(row["len_ratio_test_2016_flickr"]) == round(score.sys_len / score.ref_len, 4)
        assert (row["dataset"], row["baseline"]) == ("toy-en-de", "base")
    assert float(table["baseline"]["bp_test_2016_flickr"]) < 0.9  # SHORT is short
    pruned = table["pruned-k2"]
    assert (pruned["method"], pruned["seed"], pruned["checkpoint"]) == ("target-heads", "2", "last")
    kept = [pruned[k] for k in ("enc_self_kept", "dec_self_kept", "dec_enc_kept", "heads_total")]
    assert kept == ["2", "4", "4", "16"]
    # the fair reference from model.json, else the study's baseline; none for the baseline
    assert [table[n]["reference"] for n in table] == ["", "baseline", "baseline", "finetuned"]
    near = float(pruned["test_2016_flickr"]) - float(table["finetuned"]["test_2016_flickr"])
    assert pruned["delta_test_2016_flickr"] == f"{near:+.2f}" and 0 < near < 2
    # one sentence better is no significant difference; the references themselves are, at
    # the floor of 10,000 resamples, which is not a p-value
    assert float(pruned["p_test_2016_flickr"]) > 0.05
    assert table["perfect"]["p_test_2016_flickr"] == "< 0.0001"
    assert table["finetuned"]["p_test_2016_flickr"] == "1.0000"  # the baseline's own output
    assert table["pruned-k2"]["valid"] == "" and table["pruned-k2"]["p_valid"] == ""
    assert rows(results, refs) == list(table.values())  # deterministic


def test_p_values_are_never_written_as_the_floor():
    assert format_p(1 / 10_001) == "< 0.0001" and format_p(0.0001) == "< 0.0001"
    assert format_p(2 / 10_001) == "0.0002" and format_p(0.0495) == "0.0495"
    assert format_p(1 / 1001, 1000) == "< 0.001" and format_p(None) == "–"


def test_an_evaluation_missing_a_sentence_is_refused(tree, capsys):
    results, refs = tree
    study = results / "toy-en-de" / "base"
    evaluation(study, "partial", REFS[:-1], {"method": "random", "heads": FULL})
    with pytest.raises(SystemExit, match="59 hypotheses .* for 60 references"):
        rows(results, refs)
    # the JSON claiming fewer sentences than the references is refused too
    folder = study / "eval" / "partial"
    (folder / "test_2016_flickr.hyp").write_text("\n".join(REFS) + "\n")
    (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": 100.0, "sentences": 59}))
    with pytest.raises(SystemExit, match="misses sentences"):
        rows(results, refs)
    # a committed BLEU that the hypotheses do not give
    (folder / "test_2016_flickr.json").write_text(json.dumps({"bleu": 99.0, "sentences": 60}))
    with pytest.raises(SystemExit, match="BLEU 99.0, recomputed 100.0"):
        rows(results, refs)
    # hypotheses gone: not re-checkable, left out and named
    (folder / "test_2016_flickr.hyp").unlink()
    assert "partial" not in {r["model"] for r in rows(results, refs)}
    assert "not re-checkable" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the raw Multi30k references")
def test_committed_summary_is_the_committed_evaluations():
    """results/summary.csv as the code writes it from results/ (p columns aside: the
    bootstrap over every study takes minutes; test_rows_are_recomputed… tests it)."""
    committed = list(csv.DictReader((REPO / "results" / "summary.csv").open(encoding="utf-8")))
    fresh = rows(REPO / "results", SHARED, "--samples", "0")
    drop = {k for k in summary.COLUMNS if k.startswith("p_")}
    strip = [{k: v for k, v in r.items() if k not in drop} for r in committed]
    assert strip == [{k: v for k, v in r.items() if k not in drop} for r in fresh]
    assert all(r["p_test_2016_flickr"] for r in committed if r["reference"])


def test_posttrain_records_are_published_with_their_runs(tree, tmp_path):
    """recipes.study.posttrain writes a post-training run's model.json (FFN neurons, parameters,
    measured speed-up); recipes.study.publish copies it with gzipped hypotheses and the run's
    records into results/, where the summary reads it."""
    from recipes.study import posttrain, publish

    results, refs = tree
    run = tmp_path / "runs" / "macs0.5"
    run.mkdir(parents=True)
    masks = {"enc-self.0": [1.0, 0.0, 1.2, 1.0] * 2, "dec-self.0": [1.0] * 4,
             "dec-enc.0": [0.9, 0, 0, 0],
             "enc-ffn.0": [0.0, 1.1, 1.0], "dec-ffn.0": [1.0, 0.0]}  # fmt: skip
    prune = {"masks": masks, "budget": "macs:0.5", "params_after": 1234, "seconds": 12.34,
             "predicted_speedup": 1.4567}  # fmt: skip
    (run / "prune.json").write_text(json.dumps(prune))
    rows_ = [{"what": "encoder forward", "batch": 16, "speedup": 2.0},
             {"what": "generate beam 5", "batch": 16, "speedup": 1.23456},
             {"what": "generate beam 5", "batch": 64, "speedup": 1.5}]  # fmt: skip
    (run / "bench.json").write_text(json.dumps({"rows": rows_, "params": {"pruned": 1200}}))
    (run / "pruned.pt").write_bytes(b"weights stay out of results/")
    work = tmp_path / "work" / "eval" / "posttrain-macs0.5"
    work.mkdir(parents=True)
    (work / "test_2016_flickr.hyp").write_text("\n".join(NEAR) + "\n")
    score = round(BLEU().corpus_score(NEAR, [REFS]).score, 2)
    (work / "test_2016_flickr.json").write_text(json.dumps({"bleu": score, "sentences": 60}))
    posttrain.main(["record", "--eval-dir", str(work), "--run", str(run)])
    record = json.loads((work / "model.json").read_text())
    assert record["heads"] == {"enc-self": [6, 8], "dec-self": [4, 4], "dec-enc": [1, 4]}
    assert record["ffn"] == {"enc-ffn": [2, 3], "dec-ffn": [1, 2]}
    assert record["speedup"] == {"16": 1.235, "64": 1.5} and record["params"] == 1200
    variant = tmp_path / "variant"
    (variant / "eval").mkdir(parents=True)
    (variant / "prune.json").write_text(
        json.dumps({**prune, "sites": ["enc-self"], "rearranged": False, "tuned": True})
    )
    posttrain.main(["record", "--eval-dir", str(variant / "eval"), "--run", str(variant)])
    setting = json.loads((variant / "eval" / "model.json").read_text())["setting"]
    assert setting == "macs:0.5 of enc-self without rearrangement, no retraining"
    for flags, named in (
        ((True, "masks", 1, False), "rearranged, masks tuned"),
        ((False, "weights", 1, False), "weights refit"),
        ((False, "weights", 3, True), "3 search steps, units reselected, weights refit"),
        ((False, "none", 1, False), "untuned"),
    ):
        rearranged, tune, steps, reselected = flags
        (variant / "prune.json").write_text(json.dumps({
            **prune, "rearranged": rearranged, "tuned": True, "tune": tune,
            "search_steps": steps, "reselected": reselected,
        }))  # fmt: skip
        posttrain.main(["record", "--eval-dir", str(variant / "eval"), "--run", str(variant)])
        setting = json.loads((variant / "eval" / "model.json").read_text())["setting"]
        assert setting == f"macs:0.5, {named}, no retraining"

    study = results / "toy-en-de" / "base"
    with contextlib.redirect_stdout(io.StringIO()):
        publish.main([str(study), str(work), "--runs", "posttrain"])
    out = study / "eval" / "posttrain-macs0.5"
    assert gzip.decompress((out / "test_2016_flickr.hyp.gz").read_bytes()).decode().split(
        "\n"
    )[:-1] == NEAR  # fmt: skip
    published = json.loads((out / "model.json").read_text())
    assert (out / published["run_dir"] / "prune.json").is_file()
    assert not (out / published["run_dir"] / "pruned.pt").exists()
    row = {r["model"]: r for r in rows(results, refs)}["posttrain-macs0.5"]
    assert (row["method"], row["setting"]) == ("posttrain", "macs:0.5, no retraining")
    assert [row[k] for k in ("enc_ffn_kept", "dec_ffn_kept", "ffn_total", "params")] == [
        "2", "1", "5", "1200",
    ]  # fmt: skip
    assert (row["speedup_b16"], row["speedup_b64"]) == ("1.235", "1.5")
    assert row["speedup_predicted"] == "1.457"
    assert float(row["test_2016_flickr"]) == score and row["reference"] == "baseline"


def test_publish_refuses_an_evaluation_without_its_hypotheses(tmp_path):
    from recipes.study import publish

    folder = tmp_path / "eval" / "m"
    folder.mkdir(parents=True)
    (folder / "val.json").write_text(json.dumps({"bleu": 1.0, "sentences": 1}))
    with pytest.raises(SystemExit, match="val.json has no val.hyp"):
        publish.main([str(tmp_path / "study"), str(folder)])
    assert not (tmp_path / "study").exists()


def test_publish_gzips_large_json_records(tmp_path):
    from recipes.study import publish

    big = tmp_path / "prune.json"
    big.write_text(json.dumps({"masks": [1.0] * 20_000}))
    small = tmp_path / "bench.json"
    small.write_text("{}")
    dest = tmp_path / "dest"
    dest.mkdir()
    for f in (big, small):
        publish.copy_record(f, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["bench.json", "prune.json.gz"]
    assert gzip.decompress((dest / "prune.json.gz").read_bytes()) == big.read_bytes()


def test_publish_keeps_a_phase2_runs_validation_curve_under_its_pruning_run(tmp_path):
    """A phase-2 run (prune.sh's <run>/phase2-s<seed>) is published under its pruning run's
    name, with its validation curve and best epoch read from train.log, not the log itself."""
    from recipes.study import publish

    run = tmp_path / "prune" / "joint-k3" / "phase2-s2"
    run.mkdir(parents=True)
    (run.parent / "pruned.pt.heads.json").write_text("{}")
    saved = "2026-12-04 18:34:16 | INFO | x | Saved checkpoint {}/checkpoint_best.pt (epoch {} @"
    # the log saved checkpoint_best.pt last at epoch 2, as a run whose --best-checkpoint-metric
    # is not nll_loss may: that epoch is the best, not the later one with the same nll
    nll = [2.5, 2.3, 2.3, 2.4]
    lines = []
    for epoch, value in enumerate(nll, 1):
        lines.append(valid_log_line(epoch, value, epoch * 10))
        if epoch <= 2:
            lines.append(saved.format(run, epoch))
    (run / "train.log").write_text("\n".join(lines) + "\n")
    folder = tmp_path / "eval" / "pruned-joint-k3-s2"
    folder.mkdir(parents=True)
    (folder / "val.json").write_text(json.dumps({"bleu": 30.0, "sentences": 1}))
    (folder / "val.hyp").write_text("ein Hund\n")
    record = {"method": "two-phase", "seed": 2, "run_dir": "../../prune/joint-k3/phase2-s2"}
    (folder / "model.json").write_text(json.dumps(record))
    study = tmp_path / "study"
    publish.main([str(study), str(folder), "--runs", "prune"])
    dest = study / "prune" / "joint-k3" / "phase2-s2"
    assert sorted(p.name for p in dest.iterdir()) == ["validation.json"]
    curve = json.loads((dest / "validation.json").read_text())
    assert [e["valid_nll"] for e in curve["epochs"]] == nll
    assert [e["updates"] for e in curve["epochs"]] == [10, 20, 30, 40]
    assert curve["best_epoch"] == 2
    published = json.loads((study / "eval" / folder.name / "model.json").read_text())
    assert (study / "eval" / folder.name / published["run_dir"]).resolve() == dest.resolve()
