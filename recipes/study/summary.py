"""``results/summary.csv``: one row per evaluated model, every BLEU recomputed from its hypotheses.

    python -m recipes.study.summary results/ [--refs DIR] > results/summary.csv

Voita et al. 2019 report each pruned model by the heads it keeps per attention type and its
BLEU difference to the full model. Every study folder under RESULTS (any folder with an
``eval/`` inside, e.g. ``results/multi30k-en-de/prenorm-a/``; the dataset is the first folder
below RESULTS, the baseline the rest of the path) gives one row per ``eval/<model>/``
(``recipes.study.records`` reads its ``model.json``): heads kept per attention type, which
checkpoint, and per split BLEU, brevity penalty and hypothesis/reference length ratio,
recomputed with sacreBLEU from the committed ``<split>.hyp`` (or ``.hyp.gz``) against the
raw references ``REFS/<split>.<tgt>`` (``tgt``: the dataset name's last part, ``de``) and
checked against the committed ``<split>.json``. A post-training pruned model's record
(``recipes.study.posttrain``) adds FFN neurons kept, parameters and the beam-5 generation
speed-up, predicted by the multiply-add model and measured side by side with the full model
at batch 16 and 64. ``reference`` is the fair reference for the difference: model.json's
``"reference"``, else its ``"baseline"``, else the study's ``baseline``; ``delta_*`` and
``p_*`` are the difference to it and sacreBLEU's paired bootstrap p (10,000 resamples;
``< 0.0001`` at the floor) on validation and test_2016_flickr.

An evaluation that misses a sentence (hypotheses or the JSON's ``sentences`` ≠ references)
or whose JSON differs from the recomputed BLEU is refused (exit 1, naming the file); a model
whose hypotheses are gone cannot be re-checked and is left out (named on stderr).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from recipes.study.records import FFN_SITES, SITES, SPLITS, collect, read_hypotheses
from recipes.study.significance import SAMPLES, bootstrap, format_p

COLUMN = {"val": "valid"}  # split file name -> column name
TESTED = ("val", "test_2016_flickr")  # splits with a difference and p to the reference
DEFAULT_REFS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def column(split: str) -> str:
    return COLUMN.get(split, split)


def kept_column(site: str) -> str:
    """The column of the heads (or FFN neurons) a row kept of one site: ``enc_self_kept``."""
    return f"{site.replace('-', '_')}_kept"


HEADS_KEPT = tuple(map(kept_column, SITES))  # columns, in SITES' order
FFN_KEPT = tuple(map(kept_column, FFN_SITES))


def heads_kept(row: dict) -> str:
    """A row's heads kept per attention type: ``enc-self / dec-self / dec-enc``."""
    return " / ".join(row[k] or "?" for k in HEADS_KEPT)


COLUMNS = [
    "dataset", "baseline", "model", "method", "setting", "seed",
    *HEADS_KEPT, "heads_total", *FFN_KEPT, "ffn_total",
    "params", "speedup_predicted", "speedup_b16", "speedup_b64",
    "checkpoint",
    *(column(s) for s in SPLITS),
    *(f"bp_{column(s)}" for s in SPLITS), *(f"len_ratio_{column(s)}" for s in SPLITS),
    "reference", *(f"{k}_{column(s)}" for s in TESTED for k in ("delta", "p")),
]  # fmt: skip


class Refused(Exception):
    """An evaluation that cannot stand as a row (a missing sentence, a BLEU that differs)."""


def score(hyps: list[str], refs: list[str]) -> dict:
    """sacreBLEU's BLEU, brevity penalty and hypothesis/reference length ratio."""
    from sacrebleu.metrics import BLEU

    s = BLEU().corpus_score(hyps, [refs])
    return {
        "bleu": round(s.score, 2),
        "bp": round(s.bp, 4),
        "ratio": round(s.sys_len / s.ref_len, 4),
    }


def recheck(folder: Path, split: str, refs: list[str]) -> tuple[list[str], dict] | None:
    """The hypotheses and recomputed scores of one split of one evaluation; None when the
    split was not evaluated; Refused when it misses a sentence or its JSON disagrees."""
    record = folder / f"{split}.json"
    if not record.is_file():
        return None
    found = read_hypotheses(folder, split)
    if found is None:
        raise FileNotFoundError(f"{folder}: {split}.json without its hypotheses")
    hyp_file, hyps = found
    committed = json.loads(record.read_text())
    if len(hyps) != len(refs) or committed.get("sentences", len(refs)) != len(refs):
        raise Refused(
            f"{hyp_file}: {len(hyps)} hypotheses ({record.name}: {committed.get('sentences')} "
            f"sentences) for {len(refs)} references: the evaluation misses sentences"
        )
    scores = score(hyps, refs)
    if abs(scores["bleu"] - committed["bleu"]) > 0.011:
        raise Refused(f"{record}: BLEU {committed['bleu']}, recomputed {scores['bleu']}")
    return hyps, scores


def checkpoint_rule(row: dict) -> str:
    """``best`` (lowest validation nll) or ``last`` (end of training): which checkpoint."""
    if row.get("selected"):
        return row["selected"]
    if row.get("method") == "posttrain":  # pruned after training, with no training of its own
        return ""
    name = Path(row.get("checkpoint") or "").name
    return "best" if name == "checkpoint_best.pt" else "last" if name else ""


def make_row(r: dict, record: dict, checked: dict) -> dict:
    """One CSV row (but dataset, baseline and the paired columns) from a records row, its
    model.json and the recomputed scores per split."""
    heads = r["heads"] or {}
    ffn, speed = record.get("ffn") or {}, record.get("speedup") or {}
    ckpt = record.get("checkpoint") or r.get("checkpoint")
    fair = record.get("reference") or r.get("baseline") or "baseline"
    row = {
        "model": r["name"], "method": r["method"], "setting": r["setting"],
        "seed": record.get("seed", ""),
        **{k: heads[s][0] if s in heads else "" for s, k in zip(SITES, HEADS_KEPT)},
        "heads_total": sum(v[1] for v in heads.values() if v[1]) if heads else "",
        **{k: ffn[s][0] if s in ffn else "" for s, k in zip(FFN_SITES, FFN_KEPT)},
        "ffn_total": sum(v[1] for v in ffn.values()) if ffn else "",
        "params": record.get("params", ""),
        "speedup_predicted": record.get("predicted_speedup", ""),
        **{f"speedup_b{b}": speed.get(b, "") for b in ("16", "64")},
        "checkpoint": checkpoint_rule({**r, "checkpoint": ckpt}),
        "reference": "" if r["method"] == "baseline" and not record.get("reference") else fair,
    }  # fmt: skip
    for s in SPLITS:
        _, sc = checked.get(s) or (None, {})
        row[column(s)], row[f"bp_{column(s)}"] = sc.get("bleu", ""), sc.get("bp", "")
        row[f"len_ratio_{column(s)}"] = sc.get("ratio", "")
    return row


def study_rows(study: Path, dataset: str, refs_dir: Path, samples: int) -> list[dict]:
    """The rows of one study folder (``study/eval/*/``), sorted by model name."""
    tgt = dataset.rsplit("-", 1)[-1]
    refs = {}
    for s in SPLITS:
        ref_file = refs_dir / f"{s}.{tgt}"
        if ref_file.is_file():
            refs[s] = ref_file.read_text(encoding="utf-8").splitlines()
    out, hyps = {}, {}
    for r in collect(study, {}):
        folder = study / "eval" / r["name"]
        try:
            checked = {s: recheck(folder, s, refs[s]) for s in r["bleu"] if s in refs}
        except FileNotFoundError as e:
            print(f"not re-checkable, left out: {e}", file=sys.stderr)
            continue
        record_file = folder / "model.json"
        record = json.loads(record_file.read_text()) if record_file.is_file() else {}
        out[r["name"]] = {"dataset": dataset, **make_row(r, record, checked)}
        hyps[r["name"]] = {s: c[0] for s, c in checked.items() if c}
    for s in TESTED:
        paired(out, hyps, s, refs.get(s), samples)
    return [out[n] for n in sorted(out)]


def paired(rows: dict, hyps: dict, split: str, refs: list[str] | None, samples: int) -> None:
    """``delta_<split>`` and ``p_<split>`` of every row against its reference, in place."""
    by_reference: dict[str, list[str]] = {}
    for name, row in rows.items():
        row[f"delta_{column(split)}"] = row[f"p_{column(split)}"] = ""
        ref = row["reference"]
        if ref and ref in rows and split in hyps[name] and split in hyps[ref]:
            by_reference.setdefault(ref, []).append(name)
    for ref, names in sorted(by_reference.items()):
        systems = [(n, hyps[n][split]) for n in sorted(names)]
        result = bootstrap((ref, hyps[ref][split]), systems, refs, samples) if samples else {}
        for n in names:
            delta = rows[n][column(split)] - rows[ref][column(split)]
            rows[n][f"delta_{column(split)}"] = f"{delta:+.2f}"
            rows[n][f"p_{column(split)}"] = format_p(result[n]["p"], samples) if result else ""


def summary(results: Path, refs_dir: Path, samples: int = SAMPLES) -> list[dict]:
    rows = []
    for eval_dir in sorted(results.glob("**/eval")):
        study = eval_dir.parent
        rel = study.relative_to(results)
        if not rel.parts:
            continue
        for row in study_rows(study, rel.parts[0], refs_dir, samples):
            row["baseline"] = Path(*rel.parts[1:]).as_posix() if len(rel.parts) > 1 else ""
            rows.append(row)
    return rows


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="the folder of study folders (results/)")
    p.add_argument(
        "--refs",
        type=Path,
        default=DEFAULT_REFS,
        help="raw references <split>.<tgt> (default: ../shared/data/multi30k)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=SAMPLES,
        help="bootstrap resamples (0: no test, the p columns empty)",
    )
    args = p.parse_args(argv)
    if not args.refs.is_dir():
        p.error(f"--refs: no folder {args.refs}")
    try:
        rows = summary(args.results, args.refs, args.samples)
    except Refused as e:
        raise SystemExit(f"error: {e}") from e
    sys.stdout.write(to_csv(rows))


if __name__ == "__main__":
    main()
