"""BLEU by source-length bucket, with the paired test within each bucket.

Voita et al. 2019 ask where a pruned model loses; splitting the test sentences by source
length shows whether pruning costs more on long sentences (sacreBLEU per bucket, paired
bootstrap of each model against its baseline per bucket).
"""

from __future__ import annotations

from pathlib import Path

from recipes.study.records import hypotheses, references
from recipes.study.significance import SAMPLES, bootstrap

LENGTH_EDGES = (10, 15, 20)  # source words: <= 10, 11-15, 16-20, > 20


def bucket_names(edges: tuple[int, ...]) -> list[str]:
    lows = (1, *(e + 1 for e in edges))
    return [f"{lo}–{hi}" for lo, hi in zip(lows, edges)] + [f"> {edges[-1]}"]


def bucket_of(n_words: int, edges: tuple[int, ...]) -> int:
    return next((i for i, e in enumerate(edges) if n_words <= e), len(edges))


def length_buckets(
    work: Path,
    rows: list[dict],
    split: str,
    edges: tuple[int, ...],
    src: str,
    tgt: str,
    raw: Path | None = None,
    against: str = "baseline",
    samples: int = SAMPLES,
) -> dict:
    """sacreBLEU per source-length bucket of every row with hypotheses on ``split``; sources
    and references from ``raw`` (default ``work/raw``). Within each bucket, sacreBLEU's paired
    bootstrap (``samples`` resamples; 0: none) tests every row against the baseline it was made
    from (model.json's ``"baseline"``, else the row named ``against``): ``"p"`` {name: [p per
    bucket]}, ``"against"`` {name: baseline}, for the rows whose baseline has hypotheses."""
    from sacrebleu.metrics import BLEU

    raw = work / "raw" if raw is None else raw
    src_file = raw / f"{split}.{src}"
    refs = references(work, split, tgt, raw)
    if refs is None or not src_file.is_file():
        return {}
    sources = src_file.read_text(encoding="utf-8").splitlines()
    of = [bucket_of(len(line.split()), edges) for line in sources]
    sizes = [of.count(b) for b in range(len(edges) + 1)]
    hyps = {r["name"]: hypotheses(work, r["name"], split, len(refs)) for r in rows}
    hyps = {name: h for name, h in hyps.items() if h is not None}

    def in_bucket(lines: list[str], k: int) -> list[str]:
        return [x for x, b in zip(lines, of) if b == k]

    table = {
        name: [round(BLEU().corpus_score(in_bucket(h, k), [in_bucket(refs, k)]).score, 2)
               if sizes[k] else None for k in range(len(sizes))]
        for name, h in hyps.items()
    }  # fmt: skip
    result = {"split": split, "buckets": bucket_names(edges), "sentences": sizes, "bleu": table}
    made_from = {r["name"]: r.get("baseline") or against for r in rows}
    tested = {n: made_from[n] for n in hyps if made_from[n] != n and made_from[n] in hyps}
    if not samples or not tested:
        return result
    p_values: dict[str, list[float | None]] = {n: [None] * len(sizes) for n in tested}
    for base in sorted(set(tested.values())):
        names = sorted(n for n, b in tested.items() if b == base)
        for k in range(len(sizes)):
            if not sizes[k]:
                continue
            systems = [(n, in_bucket(hyps[n], k)) for n in names]
            reference = (base, in_bucket(hyps[base], k))
            for name, r in bootstrap(reference, systems, in_bucket(refs, k), samples).items():
                if name != base:
                    p_values[name][k] = r["p"]
    return {**result, "samples": samples, "against": tested, "p": p_values}


def length_markdown(result: dict, rows: list[dict]) -> list[str]:
    if not result.get("bleu"):
        return []
    method = {r["name"]: r["method"] for r in rows}
    p_values = result.get("p", {})
    lines = [
        "",
        f"## BLEU by source length ({result['split']})",
        "",
        "sacreBLEU of the sentences in each bucket of source words.",
    ]
    if p_values:
        lines += [
            "`*`: differs from the baseline the model was made from in that bucket "
            f"(sacreBLEU's paired bootstrap, {result['samples']} resamples, p < 0.05; the",
            "p-values in `length_buckets.json`). Small buckets test only large differences.",
        ]
    lines += [
        "",
        "| model | method | " + " | ".join(result["buckets"]) + " |",
        "|---|---|" + "---:|" * len(result["buckets"]),
        "| sentences | | " + " | ".join(map(str, result["sentences"])) + " |",
    ]
    for name, scores in result["bleu"].items():
        ps = p_values.get(name, [None] * len(scores))
        cells = [
            "–" if v is None else f"{v:.2f}" + (" *" if p is not None and p < 0.05 else "")
            for v, p in zip(scores, ps)
        ]
        lines.append(f"| {name} | {method.get(name, '?')} | " + " | ".join(cells) + " |")
    return lines
