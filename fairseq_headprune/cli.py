"""``fairseq-headprune``: inspect, score, export and benchmark pruned heads.

Tools around Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned", ACL 2019). Subcommands:

- ``gates CHECKPOINT [--json]``: P(open) and the deterministic gate of every head.
- ``export --path CKPT --out PRUNED [--mask JSON] [--fp16]``: remove closed (or unmasked) heads.
- ``bench DATA --full CKPT --pruned CKPT``: measured vs FLOP-predicted speed-ups, memory.
- ``prune DATA --path CKPT --budget macs:F --out PRUNED``: post-training pruning of heads and
  FFN neurons (Kwon et al. 2022), no retraining.
- ``flags CKPT``: the checkpoint's model flags for ``fairseq-train``.

Only the module of the subcommand being run is imported: ``gates``, ``export`` and ``flags``
read and write checkpoints with torch alone, without importing fairseq (seconds per call).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from fairseq_headprune.checkpoint_io import gates_from_state, load_checkpoint
from fairseq_headprune.errors import read_json, show_traceback, user_error
from fairseq_headprune.export import export_pruned, mask_from_scores
from fairseq_headprune.gate_trajectory import gate_summary
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


def add_gates_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune gates``."""
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


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune export``."""
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


# Subcommand: its help line and "module:function" adding its arguments (and set_defaults(func)).
SUBCOMMANDS = {
    "gates": ("show every head's P(open) and deterministic gate", "cli:add_gates_arguments"),
    "score": (
        "per-head relevance, roles and redundancy statistics",
        "scoring.command:add_score_arguments",
    ),
    "export": ("write a checkpoint with the closed heads removed", "cli:add_export_arguments"),
    "bench": ("speed and memory of a full vs a pruned checkpoint", "bench:add_bench_arguments"),
    "prune": (
        "post-training pruning of heads and FFN neurons (Kwon et al. 2022)",
        "posttrain.command:add_prune_arguments",
    ),
    "flags": ("print a checkpoint's model flags for fairseq-train", "flags:add_flags_arguments"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command's parser: every subcommand's arguments, or only ``command``'s (whose module
    alone is then imported; the others are listed with their help line)."""
    parser = argparse.ArgumentParser(prog="fairseq-headprune", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_line, target) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_line)
        if command in (None, name):
            module, function = target.split(":")
            getattr(importlib.import_module(f"fairseq_headprune.{module}"), function)(p)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        args.func(args)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        if show_traceback():
            raise
        raise SystemExit(f"error: {user_error(e) or e}") from e


if __name__ == "__main__":
    sys.exit(main())
