"""The study's report: one table and a BLEU-vs-heads plot of every evaluation (Voita et al. 2019).

    python -m recipes.study.report [--work-dir WORK_DIR] [--model NAME=CKPT ...] [--plot-split S]

(from the repository root, or through ``recipes/report.sh``). Reads every
``$WORK_DIR/eval/<NAME>/<split>.json`` (written by ``recipes/evaluate.sh``; which model each
is: ``recipes.study.records``) and writes ``$WORK_DIR/report/report.md`` (model, method,
setting, encoder heads kept, BLEU per test set; random-head runs also as mean ± sd over seeds
per head count; Voita et al.'s operating points) and ``bleu_vs_heads.png``; BLEU by
source-length bucket on ``--plot-split`` for every model whose hypotheses (``<split>.hyp``)
are there, with the paired test of each model against its baseline per bucket
(``length_buckets.json``); sacreBLEU's paired bootstrap test (10,000 resamples) of each model
against the baseline it was made from (model.json's ``"baseline"``, else
``--paired-against``; ``paired_bootstrap.json``) and of each control against the pruning run
with the same heads kept (``paired_controls.json``). With the scores of the model before
pruning (``--scores``, default ``$WORK_DIR/scores-baseline/heads.json``): each pruning run's
surviving heads with their roles and LRP relevance, and Spearman's ρ between a head's scores
and the update at which its gate closed. For the models trained from scratch, the validation
nll of their last epochs: whether they converged. Sources and references are
``WORK_DIR/raw``'s, or ``--raw-dir``'s: with it, a report can be made from committed
evaluations alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from recipes.study.heads import heads_markdown
from recipes.study.lengths import LENGTH_EDGES, length_buckets
from recipes.study.plot import plot
from recipes.study.records import SPLITS, collect
from recipes.study.significance import paired_bootstrap, paired_controls
from recipes.study.tables import write_markdown


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--work-dir",
        default=os.environ.get("WORK_DIR", str(Path.home() / "headprune-runs" / "multi30k")),
    )
    p.add_argument("--model", action="append", default=[], metavar="NAME=CKPT",
                   help="the checkpoint evaluated as eval/NAME (repeatable)")  # fmt: skip
    p.add_argument("--plot-split", default="test_2016_flickr")
    p.add_argument("--out-dir", help="default: WORK_DIR/report")
    p.add_argument("--length-edges", default=",".join(map(str, LENGTH_EDGES)),
                   help="upper ends of the source-length buckets, in words")  # fmt: skip
    p.add_argument(
        "--scores",
        help="heads.json of `fairseq-headprune score` on the model "
        "before pruning (default: WORK_DIR/scores-baseline/heads.json if there)",
    )
    p.add_argument("--paired-against", default="baseline", metavar="NAME",
                   help="the evaluation (eval/NAME) each model is tested against with "
                   "sacreBLEU's paired bootstrap on --plot-split, unless its model.json "
                   "names the baseline it was made from")  # fmt: skip
    p.add_argument("--raw-dir", help="the splits' raw source and reference text "
                   "(<split>.<lang>, as prepare.sh writes; default: WORK_DIR/raw)")  # fmt: skip
    p.add_argument("--src", default=os.environ.get("SRC", "en"))
    p.add_argument("--tgt", default=os.environ.get("TGT", "de"))
    args = p.parse_args(argv)
    edges = tuple(int(e) for e in args.length_edges.split(","))
    if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
        p.error(f"--length-edges: increasing positive word counts, got {args.length_edges!r}")
    work = Path(args.work_dir)
    models = dict(m.split("=", 1) for m in args.model)
    rows = collect(work, models)
    if not rows:
        sys.exit(f"error: no evaluations under {work / 'eval'} (run recipes/evaluate.sh)")
    splits = [s for s in SPLITS if any(s in r["bleu"] for r in rows)]
    out = Path(args.out_dir) if args.out_dir else work / "report"
    out.mkdir(parents=True, exist_ok=True)
    plot_split = args.plot_split if args.plot_split in splits else splits[0]
    raw = Path(args.raw_dir) if args.raw_dir else work / "raw"
    if args.raw_dir and not raw.is_dir():
        p.error(f"--raw-dir: no folder {raw}")
    lengths = length_buckets(
        work, rows, plot_split, edges, args.src, args.tgt, raw, args.paired_against
    )
    if lengths:
        (out / "length_buckets.json").write_text(json.dumps(lengths, indent=1) + "\n")
    scores_file = Path(args.scores) if args.scores else work / "scores-baseline" / "heads.json"
    if args.scores and not scores_file.is_file():
        p.error(f"--scores: no file {scores_file}")
    scores = json.loads(scores_file.read_text()) if scores_file.is_file() else None
    paired = paired_bootstrap(work, rows, plot_split, args.paired_against, args.tgt, raw=raw)
    paired_file = out / "paired_bootstrap.json"
    if paired:
        paired_file.write_text(json.dumps(paired, indent=1) + "\n")
    else:
        paired_file.unlink(missing_ok=True)  # not a test of these evaluations
    controls = paired_controls(work, rows, plot_split, args.tgt, raw=raw)
    controls_file = out / "paired_controls.json"
    if controls:
        controls_file.write_text(json.dumps(controls, indent=1) + "\n")
    else:
        controls_file.unlink(missing_ok=True)
    heads = heads_markdown(rows, scores, args.paired_against)
    write_markdown(rows, splits, out / "report.md", lengths, heads, paired, controls)
    plot(rows, plot_split, out / "bleu_vs_heads.png")
    print(f"wrote {out / 'report.md'} and {out / 'bleu_vs_heads.png'} ({len(rows)} models)")


if __name__ == "__main__":
    main()
