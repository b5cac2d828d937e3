"""The report's tables, plot and training curves, read from model.json records whose
checkpoints may be gone."""

import json
import re
import statistics

import pytest
import torch

from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli


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
