"""``fairseq-headprune``: inspect, score, export and benchmark pruned heads.

Tools around Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned", ACL 2019). Subcommands:

- ``gates CHECKPOINT [--json]``: P(open) and the deterministic gate of every head.
- ``export --path CKPT --out PRUNED [--mask JSON] [--fp16]``: remove closed (or unmasked) heads.
- ``bench DATA --full CKPT --pruned CKPT``: measured vs FLOP-predicted speed-ups, memory.
- ``prune DATA --path CKPT --budget macs:F --out PRUNED``: post-training pruning of heads and
  FFN neurons (Kwon et al. 2022), no retraining.
"""

from __future__ import annotations

import argparse
import json
import sys

from fairseq_headprune.bench import add_bench_parser
from fairseq_headprune.checkpoint_io import gates_from_state, load_checkpoint
from fairseq_headprune.errors import read_json, show_traceback, user_error
from fairseq_headprune.export import export_pruned, mask_from_scores
from fairseq_headprune.flags import add_flags_parser
from fairseq_headprune.gate_trajectory import gate_summary
from fairseq_headprune.posttrain.command import add_prune_parser
from fairseq_headprune.scoring.command import add_score_parser
from fairseq_headprune.sites import ENC_SELF, parse_sites


def gate_table(state: dict) -> dict:
    """Per attention type: P(open) and deterministic gate (layers × heads), open counts."""
    return gate_summary(gates_from_state(state))


def format_gate_table(table: dict) -> str:
    lines = []
    for site, t in table["sites"].items():
        n_heads = len(t["gate"][0])
        lines.append(f"{site}: {t['open']}/{t['total']} heads open  (cell: P(open) / gate)")
        lines.append("layer " + "".join(f"{'head ' + str(h):>13}" for h in range(n_heads)))
        for i, (prob, det) in enumerate(zip(t["prob_open"], t["gate"])):
            lines.append(f"{i:>5} " + "".join(f"{p:>7.3f}/{g:<5.2f}" for p, g in zip(prob, det)))
        lines.append("")
    lines.append(f"total: {table['open']}/{table['total']} heads open")
    return "\n".join(lines)


def cmd_gates(args: argparse.Namespace) -> None:
    state = load_checkpoint(args.checkpoint)
    table = gate_table(state)
    if not table["sites"]:
        raise SystemExit(f"error: {args.checkpoint} has no head gates (not a gated_transformer)")
    print(json.dumps(table, indent=1) if args.json else format_gate_table(table))


def add_gates_parser(sub) -> None:
    p = sub.add_parser("gates", help="show every head's P(open) and deterministic gate")
    p.add_argument("checkpoint", help="a gated_transformer checkpoint")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_gates)


def cmd_export(args: argparse.Namespace) -> None:
    mask = None
    if args.mask and args.scores:
        raise ValueError("give either --mask or --scores, not both")
    if args.mask:
        mask = read_json(args.mask, "--mask")
    elif args.scores:
        if args.metric is None or args.top_k is None:
            raise ValueError("--scores needs --metric and --top-k")
        sites = parse_sites(args.score_types, "--score-types")
        mask = mask_from_scores(args.scores, args.metric, args.top_k, sites, args.ascending)
    report = export_pruned(
        args.path,
        args.out,
        mask=mask,
        force=args.force,
        force_budget=args.force_budget,
        fp16=args.fp16,
    )
    for note in report["notes"]:
        print(f"note: {note}")
    for site, (kept, total) in report["heads"].items():
        print(f"{site}: kept {kept}/{total} heads")
    before, after = report["params_before"], report["params_after"]
    print(
        f"parameters: {before:,} -> {after:,} ({100 * (before - after) / before:.1f}% removed); "
        f"largest change folded into a kept head's gate: {report['gate_change']:.3g}, "
        f"largest gate of a removed head: {report['removed_gate']:.3g}"
    )
    print(f"wrote {report['out']} and {report['out']}.heads.json")


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="write a checkpoint with the closed heads removed")
    p.add_argument("--path", required=True, help="gated_transformer or transformer checkpoint")
    p.add_argument("--out", required=True, help="the pruned checkpoint to write")
    p.add_argument(
        "--mask",
        help='JSON file of heads to keep: {"enc-self": [[head indices] per layer], ...} or '
        "rows of true/false per head; required for checkpoints without gates",
    )
    p.add_argument("--scores", help="heads.json of `fairseq-headprune score`: keep the top heads")
    p.add_argument(
        "--metric",
        help="with --scores: the metric to rank by (e.g. lrp, importance, confidence)"
        ", or random:SEED",
    )
    p.add_argument("--top-k", type=int, help="with --scores: how many heads to keep")
    p.add_argument(
        "--score-types",
        default=ENC_SELF,
        help="with --scores: attention types ranked "
        "(the others keep every head; default: enc-self)",
    )
    p.add_argument("--ascending", action="store_true", help="with --scores: lower is better")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument(
        "--fp16",
        action="store_true",
        help="store the weights in fp16 (about half the file; tied embeddings stored once); "
        "fairseq loads them into an fp32 model",
    )
    p.add_argument(
        "--force-budget",
        action="store_true",
        help="export even when the gates do not decide the heads (docs/export.md): keep the "
        "heads whose gate is > 0, or a --target-heads run's K heads of highest P(open)",
    )
    p.set_defaults(func=cmd_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-headprune", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # One function per subcommand, each adding its parser with set_defaults(func=...).
    add_gates_parser(sub)
    add_score_parser(sub)
    add_export_parser(sub)
    add_bench_parser(sub)
    add_prune_parser(sub)
    add_flags_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        if show_traceback():
            raise
        raise SystemExit(f"error: {user_error(e) or e}") from e


if __name__ == "__main__":
    sys.exit(main())
