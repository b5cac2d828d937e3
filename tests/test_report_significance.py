"""The report's paired bootstrap tests (sacreBLEU, 10,000 resamples): each model against its
baseline, within source-length buckets, and each control against its pruning run."""

import json
import shutil
from pathlib import Path

from sacrebleu.metrics import BLEU


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
