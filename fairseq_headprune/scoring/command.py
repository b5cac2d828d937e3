"""``fairseq-headprune score``: every per-head metric of a checkpoint on a data split.

The scores of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned", ACL 2019) — LRP relevance, confidence,
positional, syntactic and rare-word roles — and the redundancy statistics of Michel et al.
2019 ("Are Sixteen Heads Really Better than One?") — entropy, output norm, gradient
importance, head similarity (cosine and CKA, Kornblith et al. 2019), single-head and greedy
ablation — for a stock ``transformer`` or a ``gated_transformer`` checkpoint. See
docs/scoring.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from fairseq_headprune.scoring.attention_stats import AttentionStats
from fairseq_headprune.scoring.base import Batches, PassScorer, ScoringModel, run_pass
from fairseq_headprune.scoring.importance import (
    GradientImportance,
    OutputNorm,
    ablation_curve,
    single_head_ablation,
)
from fairseq_headprune.scoring.lrp import LRPRelevance
from fairseq_headprune.scoring.outputs import (
    add_summaries,
    atomic_dir,
    head_records,
    write_outputs,
)
from fairseq_headprune.scoring.similarity import HeadSimilarity
from fairseq_headprune.scoring.syntax import (
    SyntaxAccuracy,
    matches,
    parse_with_stanza,
    read_conllu,
    source_words,
)
from fairseq_headprune.sites import ENC_SELF, parse_sites

logger = logging.getLogger(__name__)

METRICS = (
    "lrp", "confidence", "entropy", "positional", "rare", "syntax", "importance", "norm",
    "similarity", "ablation", "curve",
)  # fmt: skip
MIN_MATCHED = 0.5  # fewer matching trees than this fraction of the sentences: an error


def parse_metrics(value: str, have_trees: bool) -> list[str]:
    """``all`` or a comma list → metric names; ``syntax`` needs trees (dropped from ``all``)."""
    if value.strip() == "all":
        return [m for m in METRICS if m != "syntax" or have_trees]
    names = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown or not names:
        raise ValueError(f"--metrics: unknown metric(s) {unknown}; choose from {list(METRICS)}")
    if "syntax" in names and not have_trees:
        raise ValueError("--metrics syntax needs trees: pass --conllu FILE or --parse stanza")
    return [m for m in METRICS if m in names]


def load(data: str, path: str):
    """The model and task of a fairseq checkpoint (plugin registered, data dir overridden)."""
    import fairseq_headprune  # noqa: F401  registers the plugin and safe checkpoint loading
    from fairseq_headprune.checkpoint_io import load_model_and_task

    return load_model_and_task(path, data)


def align_trees(args, batches: Batches, task) -> tuple[dict, dict, int, str]:
    """Trees of the scored sentences that match their source line, word maps, skipped."""
    dictionary, dataset = task.source_dictionary, batches.dataset
    n = batches.n_sentences
    sents = [
        source_words([dictionary[t] for t in dataset.src[i].tolist() if t != dictionary.eos()])
        for i in range(n)
    ]
    if args.conllu:
        trees, source = read_conllu(args.conllu), f"gold CoNLL-U {args.conllu}"
    else:
        trees, source = parse_with_stanza([w for w, _ in sents]), "stanza parser"
    good = {
        i: t for i, t in enumerate(trees[:n]) if matches(t.words, sents[i][0], dictionary.unk_word)
    }
    if len(good) < MIN_MATCHED * n:
        first = next(i for i in range(n) if i not in good)
        tree = " ".join(trees[first].words) if first < len(trees) else "(no sentence)"
        raise ValueError(
            f"the trees do not match subset '{args.subset}': only {len(good)} of {n} sentences "
            f"match; sentence {first}: trees say {tree!r}, the source is "
            f"{' '.join(sents[first][0])!r}"
        )
    word_of = {i: sents[i][1] for i in good}
    return good, word_of, n - len(good), source


def score(args: argparse.Namespace) -> dict:
    """Compute the requested metrics; return the heads.json report and the score tensors."""
    have_trees = bool(args.conllu or args.parse)
    metrics = parse_metrics(args.metrics, have_trees)
    torch.manual_seed(args.seed)
    model, task = load(args.data, args.path)
    sm = ScoringModel(model, task)
    keep = report_sites(getattr(args, "sites", None), sm.sites, "syntax" in metrics)
    batches = Batches(task, args.subset, args.max_sentences, args.batch_size, progress=None)
    logger.info("scoring %d sentences of %s: %s", batches.n_sentences, args.subset, metrics)
    scores: dict = {"gate": sm.base}
    report: dict = {"syntax": None, "similarity": None, "ablation": None}
    scores.update(_one_pass_scores(args, sm, task, batches, metrics, report))
    if "lrp" in metrics:
        with _phase("LRP relevance"):
            scores.update(LRPRelevance()(sm, batches))
    if "ablation" in metrics or "curve" in metrics:
        report["ablation"] = _ablation(sm, batches, metrics, args.ablation_step, scores)
    _drop_unrequested(scores, metrics)
    dropped = set(sm.sites) - set(keep)  # attention types not reported (--sites)
    scores = {n: {k: v for k, v in per.items() if k not in dropped} for n, per in scores.items()}
    add_summaries(scores, report)
    thresholds = {
        "positional": args.positional_threshold,
        "syntactic_margin": args.syntactic_margin,
        "rare_margin": args.rare_margin,
    }
    shapes = {s: sm.shape(s) for s in keep}
    report = {
        "format": "fairseq-headprune/heads",
        "version": 1,
        "checkpoint": str(args.path),
        "data": str(args.data),
        "subset": args.subset,
        "sentences": batches.n_sentences,
        "metrics": metrics,
        "thresholds": thresholds,
        "sites": {s: {"layers": L, "heads": H} for s, (L, H) in shapes.items()},
        "heads": head_records(scores, shapes, thresholds),
        "rare_word_average": {s: float(v.mean()) for s, v in scores.get("rare_word", {}).items()},
        **report,
    }
    return {"report": report, "scores": scores}


def _one_pass_scores(
    args: argparse.Namespace, sm: ScoringModel, task, batches: Batches, metrics, report: dict
) -> dict:
    """The metrics that one teacher-forced pass gives together (``report["syntax"]`` set)."""
    scorers: list[PassScorer] = []
    if {"confidence", "entropy", "positional", "rare"} & set(metrics):
        scorers.append(AttentionStats.for_model(sm))
    if "syntax" in metrics:
        trees, word_of, skipped, source = align_trees(args, batches, task)
        scorers.append(SyntaxAccuracy(trees, word_of))
        report["syntax"] = {"trees": source, "matched": len(trees), "skipped": skipped}
    for name, cls in (("importance", GradientImportance), ("norm", OutputNorm)):
        if name in metrics:
            scorers.append(cls())
    if "similarity" in metrics:
        scorers.append(HeadSimilarity())
    scores: dict = {}
    if scorers:
        with _phase("one pass: " + ", ".join(type(s).__name__ for s in scorers)):
            run_pass(sm, batches, scorers)
        for scorer in scorers:
            result = scorer.result()
            if isinstance(scorer, (AttentionStats, SyntaxAccuracy)):
                _blank_removed(result, sm.removed)
            scores.update(result)
    return scores


def _ablation(sm: ScoringModel, batches: Batches, metrics, step: int, scores: dict) -> dict:
    """Single-head ablation (into ``scores``) and the greedy ablation curve, as requested."""
    with _phase("single-head ablation" if "ablation" in metrics else "base loss"):
        base_loss, delta = (
            single_head_ablation(sm, batches)
            if "ablation" in metrics
            else (sm.mean_loss(batches), None)
        )
    if delta is not None:
        scores["ablation_delta_loss"] = delta
    curve = None
    if "curve" in metrics:
        with _phase("greedy ablation curve"):
            curve = ablation_curve(sm, batches, step)
    return {"base_loss": base_loss, "curve": curve}


def report_sites(value: str | None, model_sites: list[str], syntax: bool) -> list[str]:
    """``--sites``: the attention types whose heads are reported (default: all the model has).

    The model always runs whole; the others' scores are computed and dropped. Useful when
    only some are meaningful, e.g. ``enc-self`` on source-only data with a placeholder target.
    """
    if value is None:
        return list(model_sites)
    keep = list(parse_sites(value, "--sites"))
    missing = [s for s in keep if s not in model_sites]
    if not keep or missing:
        raise ValueError(f"--sites: {value!r}; this model has {model_sites}")
    if syntax and ENC_SELF not in keep:
        raise ValueError("--sites: syntax scores encoder self-attention; include enc-self")
    return keep


@contextlib.contextmanager
def _phase(name: str) -> Iterator[None]:
    """Log the start and the duration of a scoring phase (progress bars show only on a tty)."""
    logger.info("%s ...", name)
    t0 = time.perf_counter()
    yield
    logger.info("%s done in %.1f s", name, time.perf_counter() - t0)


def _blank_removed(result: dict, removed: dict) -> None:
    """No attention statistics (NaN → null in heads.json) for heads an export removed."""
    for name, per_site in result.items():
        if name.startswith("baseline_"):
            continue
        for site, values in per_site.items():
            mask = removed.get(site)
            if mask is not None and torch.is_tensor(values) and values.shape == mask.shape:
                values[mask] = float("nan")


def _drop_unrequested(scores: dict, metrics: list[str]) -> None:
    """AttentionStats computes its four families together; keep only the requested ones."""
    families = {
        "confidence": ["confidence"],
        "entropy": ["entropy"],
        "positional": ["positional_offset", "positional_fraction"],
        "rare": ["rare_word"],
    }
    for metric, names in families.items():
        if metric not in metrics:
            for name in names:
                scores.pop(name, None)


def cmd_score(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    result = score(args)
    with atomic_dir(out, force=args.force) as tmp:
        write_outputs(tmp, result["report"], result["scores"])
    syntax = result["report"].get("syntax")
    if syntax:
        print(
            f"syntax: {syntax['matched']} sentences matched their trees, {syntax['skipped']} "
            f"skipped (their tokens do not match the {syntax['trees']})"
        )
    print(f"wrote {out}/heads.json, heads.csv, summary.md and heatmaps")


def add_score_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune score``."""
    p.add_argument("data", help="fairseq-preprocess output folder (binarized data)")
    p.add_argument("--path", required=True, help="a transformer or gated_transformer checkpoint")
    p.add_argument("--subset", default="valid", help="data split to score (default: valid)")
    trees = p.add_mutually_exclusive_group()
    trees.add_argument("--conllu", help="gold dependency trees of the split's source sentences")
    trees.add_argument("--parse", choices=["stanza"], help="parse the source with stanza")
    p.add_argument(
        "--metrics", default="all", help=f"'all' or a comma list of {', '.join(METRICS)}"
    )
    p.add_argument("--sites", help="report only these attention types, a comma list of "
                   "enc-self, dec-self, dec-enc (default: all)")  # fmt: skip
    p.add_argument("--max-sentences", type=int, help="score only the first N sentences")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument("--positional-threshold", type=float, default=0.9,
                   help="fraction of maxima at one offset for a positional head")  # fmt: skip
    p.add_argument("--syntactic-margin", type=float, default=0.1,
                   help="accuracy over the positional baseline for a syntactic head")  # fmt: skip
    p.add_argument("--rare-margin", type=float, default=0.2,
                   help="rare-word accuracy above the average head: a rare-word head")  # fmt: skip
    p.add_argument("--ablation-step", type=int, default=0,
                   help="heads removed per step of the greedy curve (0: about 10%%)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=cmd_score)
