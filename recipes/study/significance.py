"""Paired bootstrap resampling (Koehn 2004) of BLEU differences, through sacreBLEU.

Each model is tested against the baseline it was made from, and each control against the
pruning run with the same heads kept (Voita et al. 2019's comparisons). ``SAMPLES`` (10,000)
resamples with sacreBLEU's fixed seed; sacreBLEU's p is (count + 1) / (samples + 1), so the
smallest p it can give is a floor, written ``p < 0.0001`` (``format_p``), never as a value.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from recipes.study.records import (
    CONTROL_METHODS,
    PRUNING_METHODS,
    budget_key,
    hypotheses,
    references,
)

SAMPLES = 10_000


def format_p(p: float | None, samples: int = SAMPLES) -> str:
    """``p`` with 4 decimals, ``< 1/samples`` at sacreBLEU's floor, ``–`` for no test."""
    if p is None:
        return "–"
    if p * samples <= 1.0 + 1e-9:
        return f"< {1 / samples:g}"
    return f"{p:.4f}"


def bootstrap(
    reference: tuple[str, list[str]],
    systems: list[tuple[str, list[str]]],
    refs: list[str],
    samples: int,
) -> dict[str, dict]:
    """sacreBLEU's paired bootstrap resampling of ``systems`` against ``reference`` (each a
    name and its hypotheses): {name: {"bleu", "mean", "ci", "p"}}, ``p`` None for the
    reference itself and 1 for hypotheses identical to the reference's."""
    import logging

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # a line per system and step
    _, results = PairedTest(
        [reference] + systems, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples
    )()
    # sacreBLEU (after MultEval) gives hypotheses identical to the reference's p = 1/(n+1), so
    # that "a zero difference is not attributed to chance"; here no difference is no finding
    same = {name for name, hyps in systems if hyps == reference[1]}
    return {
        name: {
            "bleu": round(r.score, 2), "mean": round(r.mean, 2), "ci": round(r.ci, 2),
            "p": None if r.p_value is None else 1.0 if name in same else round(r.p_value, 4),
        }
        for name, r in zip(results["System"], results["BLEU"])
    }  # fmt: skip


def paired_bootstrap(
    work: Path,
    rows: list[dict],
    split: str,
    against: str,
    tgt: str,
    samples: int = SAMPLES,
    raw: Path | None = None,
) -> dict:
    """sacreBLEU's paired bootstrap test of every row with hypotheses on ``split`` against the
    baseline it was made from: model.json's ``"baseline"``, else the row named ``against``.
    {"split", "against", "samples", "models": {name: {"bleu", "mean", "ci", "p", "against"}},
    "untested": {name: baseline}} (``p`` and ``against`` None for a reference itself;
    ``untested``: rows whose baseline has no hypotheses); {} when nothing was tested."""
    refs = references(work, split, tgt, raw)
    if refs is None:
        return {}
    groups: dict[str, list[str]] = defaultdict(list)  # baseline -> the rows made from it
    for r in sorted(rows, key=lambda r: r["name"]):
        base = r.get("baseline") or against
        if r["name"] != base:
            groups[base].append(r["name"])
    models: dict[str, dict] = {}
    untested: dict[str, str] = {}
    for base in sorted(groups, key=lambda b: (b != against, b)):
        reference = hypotheses(work, base, split, len(refs))
        hyps = {n: hypotheses(work, n, split, len(refs)) for n in groups[base]}
        systems = [(n, h) for n, h in hyps.items() if h is not None]
        if reference is None:
            untested.update((n, base) for n, _ in systems)
            continue
        if not systems:
            continue
        for name, result in bootstrap((base, reference), systems, refs, samples).items():
            models.setdefault(name, {**result, "against": None if name == base else base})
    if not any(m["against"] for m in models.values()):
        return {}
    return {
        "split": split, "against": against, "samples": samples, "models": models,
        "untested": untested,
    }  # fmt: skip


def paired_controls(
    work: Path,
    rows: list[dict],
    split: str,
    tgt: str,
    samples: int = SAMPLES,
    raw: Path | None = None,
) -> dict:
    """sacreBLEU's paired bootstrap of every control (``CONTROL_METHODS``) against each pruning
    run with the same heads kept per attention type, made from the same baseline: are the
    heads the gates kept better than heads chosen or trained another way? {"split",
    "samples", "pairs": [{"model", "method", "against", "bleu", "against_bleu", "p"}]};
    {} when no such pair has hypotheses on ``split``."""
    refs = references(work, split, tgt, raw)
    if refs is None:
        return {}
    controls = [r for r in rows if r["method"] in CONTROL_METHODS and budget_key(r)]
    pairs = []
    for pruned in sorted(rows, key=lambda r: r["name"]):
        if pruned["method"] not in PRUNING_METHODS or not budget_key(pruned):
            continue
        same = sorted(
            (c for c in controls if budget_key(c) == budget_key(pruned)), key=lambda c: c["name"]
        )
        reference = hypotheses(work, pruned["name"], split, len(refs)) if same else None
        systems = [(c["name"], hypotheses(work, c["name"], split, len(refs))) for c in same]
        systems = [(n, h) for n, h in systems if h is not None]
        if reference is None or not systems:
            continue
        scores = bootstrap((pruned["name"], reference), systems, refs, samples)
        method = {c["name"]: c["method"] for c in same}
        for name, _ in systems:
            pairs.append({
                "model": name, "method": method[name], "against": pruned["name"],
                "bleu": scores[name]["bleu"], "against_bleu": scores[pruned["name"]]["bleu"],
                "p": scores[name]["p"],
            })  # fmt: skip
    return {"split": split, "samples": samples, "pairs": pairs} if pairs else {}
