"""The ``fairseq-headprune score`` command end to end on the tiny stock model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_headprune.scoring.command import report_sites
from fairseq_headprune.scoring.outputs import SCHEMA_PATH, validate
from tests.export_helpers import write_gated
from tests.helpers import TRAIN_COMMON, USER_DIR, cli

RELS = ("nsubj", "obj", "amod", "advmod")


def write_conllu(raw_src: Path, path: Path, n: int | None = None) -> None:
    """A made-up tree for each source line: word i+1 depends on word i, cycling relations."""
    blocks = []
    for s, line in enumerate(raw_src.read_text().splitlines()[:n]):
        words = line.split()
        rows = [f"# sent_id = {s}"]
        for i, w in enumerate(words):
            head, rel = (0, "root") if i == 0 else (i, RELS[i % 4] + (":pass" if i == 1 else ""))
            rows.append(f"{i + 1}\t{w}\t{w}\tX\t_\t_\t{head}\t{rel}\t_\t_")
        blocks.append("\n".join(rows))
    path.write_text("\n\n".join(blocks) + "\n\n")


@pytest.fixture(scope="module")
def conllu(tiny_data, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trees") / "valid.conllu"
    write_conllu(tiny_data.parent / "raw" / "valid.src", path)
    return path


def test_score_writes_every_output(tiny_data, stock_checkpoint, conllu, tmp_path):
    out = tmp_path / "scores"
    proc = cli(
        "fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint,
        "--conllu", conllu, "--out", out, "--max-sentences", "24", "--ablation-step", "6",
    )  # fmt: skip
    assert "syntax: 24 sentences matched their trees, 0 skipped" in proc.stdout
    report = json.loads((out / "heads.json").read_text())
    validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert len(report["heads"]) == 3 * 2 * 4
    assert report["syntax"]["matched"] == 24 and report["syntax"]["skipped"] == 0
    assert set(report["syntax"]["baselines"]) >= {"nsubj_dep2head", "obj_head2dep"}
    enc = [r for r in report["heads"] if r["site"] == "enc-self"]
    assert all(r["syntax"] and r["lrp"] is not None for r in enc)
    assert all(r["ablation_delta_loss"] is not None for r in report["heads"])
    assert report["ablation"]["curve"][-1]["removed"] == 24
    assert len(report["similarity"]["dec-enc"]["cka"]) == 2
    files = {p.name for p in out.iterdir()}
    assert {"heads.json", "heads.csv", "summary.md", "ablation_curve.png", "lrp.png"} <= files
    assert {"confidence.png", "importance.png", "syntax_nsubj_dep2head.png"} <= files
    summary = (out / "summary.md").read_text()
    assert "Positional heads" in summary and "Rare-word heads" in summary
    assert len((out / "heads.csv").read_text().splitlines()) == 1 + 24
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders


def _fails(tiny_data, ckpt, tmp_path, *args) -> str:
    out = tmp_path / "bad"
    proc = cli("fairseq-headprune", "score", tiny_data, "--path", ckpt, "--out", out, *args,
               check=False)  # fmt: skip
    assert proc.returncode != 0 and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]
    return proc.stderr


def test_score_errors_are_clear(tiny_data, stock_checkpoint, conllu, tmp_path):
    err = _fails(tiny_data, stock_checkpoint, tmp_path, "--metrics", "lrp,bogus")
    assert "unknown metric" in err and "bogus" in err
    err = _fails(tiny_data, stock_checkpoint, tmp_path, "--metrics", "syntax")
    assert "--conllu" in err
    bad = tmp_path / "bad.conllu"
    bad.write_text("this is not conll-u\n\n")
    assert "not a CoNLL-U" in _fails(tiny_data, stock_checkpoint, tmp_path, "--conllu", bad)
    other = tmp_path / "other.conllu"
    write_conllu(tiny_data.parent / "raw" / "train.src", other, n=40)
    err = _fails(tiny_data, stock_checkpoint, tmp_path, "--conllu", other)
    assert "do not match" in err
    err = _fails(tiny_data, stock_checkpoint, tmp_path, "--subset", "nosuch", "--metrics",
                 "confidence")  # fmt: skip
    assert "nosuch" in err
    err = _fails(tiny_data, stock_checkpoint, tmp_path, "--metrics", "entropy",
                 "--max-sentences", "0")  # fmt: skip
    assert "empty" in err
    err = _fails(tiny_data, tiny_data / "dict.src.txt", tmp_path, "--metrics", "entropy")
    assert "error" in err


def test_score_rejects_a_non_transformer(tiny_data, tmp_path):
    cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "lstm",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "8",
        "--decoder-embed-dim", "8", "--encoder-hidden-size", "8", "--decoder-hidden-size", "8",
        "--decoder-out-embed-dim", "8", *TRAIN_COMMON, "--max-update", "1",
        "--save-dir", tmp_path / "lstm", check=False,
    )  # fmt: skip
    # (this LSTM run can abort in torch's teardown after saving; only the checkpoint matters)
    assert (tmp_path / "lstm" / "checkpoint_last.pt").exists()
    err = _fails(tiny_data, tmp_path / "lstm" / "checkpoint_last.pt", tmp_path)
    assert "not a fairseq transformer" in err


def test_exported_model_scores_like_the_gated_model_it_came_from(
    stock_checkpoint, tiny_data, tmp_path
):
    """Removed heads keep their (layer, head) place: gate 0, no attention statistics."""
    closed = {("enc-self", 0): [1, 2], ("dec-enc", 1): [0, 1, 2, 3]}
    thetas = {  # θ 6: gate exactly 1; -6: exactly 0
        site: [[-6.0 if h in closed.get((site, layer), []) else 6.0 for h in range(4)]
               for layer in range(2)]
        for site in ("enc-self", "dec-self", "dec-enc")
    }  # fmt: skip
    gated, exported = tmp_path / "gated.pt", tmp_path / "exported.pt"
    write_gated(stock_checkpoint, gated, thetas)
    cli("fairseq-headprune", "export", "--path", gated, "--out", exported)
    metrics = "confidence,entropy,lrp,importance,ablation"
    heads = {}
    for name, path in (("gated", gated), ("exported", exported)):
        out = tmp_path / f"scores-{name}"
        cli("fairseq-headprune", "score", tiny_data, "--path", path, "--subset", "valid",
            "--metrics", metrics, "--out", out)  # fmt: skip
        records = json.loads((out / "heads.json").read_text())["heads"]
        heads[name] = {(r["site"], r["layer"], r["head"]): r for r in records}
    assert heads["gated"].keys() == heads["exported"].keys() and len(heads["gated"]) == 24
    removed = {("enc-self", 0, 1), ("enc-self", 0, 2)} | {("dec-enc", 1, h) for h in range(4)}
    for key, g in heads["gated"].items():
        e = heads["exported"][key]
        assert e["gate"] == g["gate"] == (0.0 if key in removed else 1.0)
        for field in ("lrp", "importance", "ablation_delta_loss"):
            assert e[field] == pytest.approx(g[field], abs=1e-4), (key, field)
        for field in ("confidence", "entropy"):
            if key in removed:
                assert e[field] is None  # the head is not there
            else:
                assert e[field] == pytest.approx(g[field], abs=1e-4), (key, field)


def test_report_sites_checks_the_attention_types():
    model = ["enc-self", "dec-self", "dec-enc"]
    assert report_sites(None, model, syntax=True) == model
    assert report_sites("dec-enc,enc-self", model, syntax=True) == ["enc-self", "dec-enc"]
    with pytest.raises(ValueError, match="include enc-self"):
        report_sites("dec-self", model, syntax=True)
    with pytest.raises(ValueError, match="unknown attention type"):
        report_sites("enc-self,decoder", model, syntax=False)
    with pytest.raises(ValueError, match="this model has"):
        report_sites("none", model, syntax=False)
