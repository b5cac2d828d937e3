"""Head sets for the control runs of ``recipes/controls.sh`` (Voita et al. 2019's comparisons).

Subcommands (each writes JSON that ``fairseq-headprune export --mask`` reads):

- ``budget --baseline CKPT --kept HEADS_JSON``: the head budget a pruned model defines, i.e.
  the number of heads kept per attention type that it reduced. Prints two lines: a tag for run
  folders (``k6``, or ``k6-dec-enc20`` when other types were pruned too) and the budget
  (``enc-self:6,dec-enc:20``). ``--spec K`` or ``--spec TYPE:K,...`` instead of ``--kept``
  gives the budget directly (``K`` alone: encoder self-attention), with the same two lines.
- ``topk --scores heads.json --metric M --budget B --out MASK``: the top-K heads of each
  budgeted type by a metric of ``fairseq-headprune score`` (``lrp``, ``importance``, …) or at
  random (``random:SEED``), ranked within each type with ``export.mask_from_scores`` — for an
  encoder-only budget the same heads as ``export --scores … --metric M --top-k K``.
- ``michel --data DATA --path CKPT --budget B --out MASK``: Michel et al. 2019's iterative
  importance pruning: compute the gradient importance of every head (normalised per layer)
  under the current mask, remove the ``--step`` least important remaining heads of each
  budgeted type (default: 10 % of its heads), recompute, until the budget is reached. Heads are
  masked through the scorer's fixed gates (no retraining between steps, as in the paper), by
  ``fairseq_headprune.scoring.importance.iterative_pruning``, which also draws the scorer's
  greedy ablation curve.
  The steps (heads removed, mean validation NLL) go to ``MASK`` next to the mask, under
  ``"steps"``.
- ``record --eval-dir DIR --method M --checkpoint CKPT --kept HEADS_JSON [--seed S] [--setting
  TEXT | --phase2-of GATED | --phase2-budget-of NAME] [--baseline NAME] [--selected last]
  [--reference NAME] [--run-dir RUN]``: write ``DIR/model.json``, which
  ``recipes.study.records`` reads (with the kept and total heads per attention type, from CKPT;
  ``"selected": "last"`` for a run's last checkpoint, whose random draws it averages apart from
  those of best checkpoints; ``"reference"``: the NAME of the fair reference, e.g. the full
  model fine-tuned alike; ``"run_dir"``: the training run's folder, whose records
  ``recipes.study.publish`` commits with the evaluation). ``--phase2-of`` the gated run's
  checkpoint, or its phase-1 record (the ``model.json`` that ``record-gated`` wrote, committed
  with its evaluation): the setting is that run's, then ``phase 2 (seed S)``.
  ``--phase2-budget-of`` the evaluation NAME of a two-phase run's phase 2 whose fine-tuning
  budget a control was given: the setting is ``phase-2 budget`` (with the seed of a random draw)
  and NAME the fair reference.
- ``record-gated --eval-dir DIR --checkpoint CKPT [--setting TEXT] [--phase1-epochs N]
  [--reference NAME]``: the same for a gated run's last checkpoint (phase 1 of the two-phase
  protocol, or the one-phase model): method, setting, gated types and heads kept from its
  deterministic gates (``recipes.study.records.checkpoint_info``), and the run's folder
  (``run_dir``), so that the row still reads when the checkpoint is gone. ``--phase1-epochs``:
  the run is phase 1 of the two-phase protocol, its setting ends in ``phase 1: N epochs``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

from fairseq_headprune.budget import TOTAL, parse_target_heads
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.sites import ENC_SELF, SITES
from recipes.study.records import PHASE2_BUDGET


def head_totals(checkpoint: str) -> dict[str, int]:
    """Attention type → number of heads of the full (unpruned) model."""
    from fairseq_headprune.checkpoint_io import head_layout, load_checkpoint

    layout = head_layout(load_checkpoint(checkpoint))
    return {s: n_layers * n_heads for s, (n_layers, n_heads) in layout.items()}


def parse_budget(spec: str) -> dict[str, int]:
    """``TYPE:K,...`` → heads kept per attention type, read by the plugin's ``--target-heads``
    parser (a total K is refused: the controls need a budget per type)."""
    counts = parse_target_heads(spec, SITES)
    if TOTAL in counts:
        raise HeadpruneError(f"budget {spec!r}: give one per attention type, TYPE:K,...")
    return counts


def cmd_budget(args: argparse.Namespace) -> None:
    totals = head_totals(args.baseline)
    if args.spec is not None:
        spec = args.spec if ":" in args.spec else f"{ENC_SELF}:{args.spec}"
        try:
            counts = parse_budget(spec)
        except ValueError as err:
            raise SystemExit(f"budget {args.spec!r}: expected K or TYPE:K,... ({err})") from None
        for site, k in counts.items():
            if not 0 <= k <= totals[site]:
                raise SystemExit(f"budget {args.spec!r}: {site} has {totals[site]} heads, not {k}")
    else:
        kept = json.loads(Path(args.kept).read_text())
        counts = {s: sum(map(len, rows)) for s, rows in kept.items()}
    pruned = [s for s in SITES if s in counts and counts[s] < totals[s]]
    sites = [ENC_SELF] + [s for s in pruned if s != ENC_SELF]
    tag = f"k{counts.get(ENC_SELF, totals[ENC_SELF])}"
    tag += "".join(f"-{s}{counts[s]}" for s in sites[1:])
    print(tag)
    print(",".join(f"{s}:{counts.get(s, totals[s])}" for s in sites))


def write_json(path: str, obj: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def cmd_topk(args: argparse.Namespace) -> None:
    from fairseq_headprune.export import mask_from_scores

    mask = {}
    for site, k in parse_budget(args.budget).items():
        mask.update(mask_from_scores(args.scores, args.metric, k, (site,), args.ascending))
    write_json(args.out, mask)


def cmd_michel(args: argparse.Namespace) -> None:
    import torch

    from fairseq_headprune.scoring.base import Batches, ScoringModel
    from fairseq_headprune.scoring.command import load
    from fairseq_headprune.scoring.importance import iterative_pruning, open_heads

    torch.manual_seed(args.seed)
    model, task = load(args.data, args.path)
    sm = ScoringModel(model, task)
    batches = Batches(task, args.subset, args.max_sentences, args.batch_size, progress=None)
    budget = parse_budget(args.budget)
    # each budgeted type ranked apart; Michel et al.: 10 % of its heads per step
    groups = [
        (open_heads(sm.base, [s]), args.step or max(1, math.ceil(sm.base[s].numel() / 10)), k)
        for s, k in budget.items()
    ]

    def report(row: dict) -> None:
        n, loss = len(row["removed"]), row["loss"]
        print(f"michel: removed {n} heads, mean {args.subset} NLL {loss:.4f}", file=sys.stderr)

    values, steps = iterative_pruning(sm, batches, groups, on_step=report)
    mask = {
        s: [[h for h in range(values[s].shape[1]) if values[s][i, h] > 0] for i in range(len(v))]
        for s, v in values.items()
        if s in budget
    }
    write_json(args.out, mask)
    write_json(args.out + ".steps.json", {"budget": budget, "steps": steps})


def cmd_record(args: argparse.Namespace) -> None:
    if args.phase2_of and args.seed is None:
        raise SystemExit("record: --phase2-of needs the phase-2 --seed")
    Path(args.eval_dir).mkdir(parents=True, exist_ok=True)
    record = {
        "method": args.method,
        "checkpoint": str(Path(args.checkpoint).resolve()),
        "kept_heads": json.loads(Path(args.kept).read_text()),
    }
    if args.seed is not None:
        record["seed"] = args.seed
    # the head totals too, so that the record still reads when the checkpoint is gone
    totals = head_totals(args.checkpoint)
    record["heads"] = {
        s: [sum(map(len, rows)), totals[s]] for s, rows in record["kept_heads"].items()
    }
    if args.phase2_of:
        phase2 = f"phase 2 (seed {args.seed})"
        args.setting = ", ".join(filter(None, (gated_setting(Path(args.phase2_of)), phase2)))
    if args.phase2_budget_of:  # a control fine-tuned like that run's phase 2, compared with it
        seed = f"seed {args.seed}" if args.seed is not None else ""
        args.setting = ", ".join(filter(None, (PHASE2_BUDGET, seed)))
        args.reference = args.reference or args.phase2_budget_of
    for key in ("setting", "baseline", "selected", "reference"):
        if getattr(args, key):
            record[key] = getattr(args, key)
    if args.run_dir:  # its records (train.log's validation curve) published with it
        record["run_dir"] = os.path.relpath(
            Path(args.run_dir).resolve(), Path(args.eval_dir).resolve()
        )
    write_json(str(Path(args.eval_dir) / "model.json"), record)


def cmd_record_gated(args: argparse.Namespace) -> None:
    from recipes.study.records import checkpoint_info

    checkpoint = Path(args.checkpoint).resolve()
    info = checkpoint_info(checkpoint)
    if not info["gated"]:
        raise SystemExit(f"record-gated: {args.checkpoint} has no head gates (not a gated run)")
    eval_dir = Path(args.eval_dir).resolve()
    eval_dir.mkdir(parents=True, exist_ok=True)
    setting = _phase1(args.setting or info["setting"], args.phase1_epochs)
    record = {
        "method": info["method"], "setting": setting,
        "heads": info["heads"], "gated": info["gated"], "checkpoint": str(checkpoint),
        "kept_heads": info["kept"], "run_dir": os.path.relpath(checkpoint.parent, eval_dir),
    }  # fmt: skip
    if args.reference:
        record["reference"] = args.reference
    write_json(str(eval_dir / "model.json"), record)


def gated_setting(path: Path) -> str:
    """The setting of the gated run whose structure phase 2 trains, from its checkpoint or from
    its phase-1 record (``model.json``: the setting without its ``phase 1: N epochs``)."""
    if path.suffix == ".json":
        setting = json.loads(path.read_text())["setting"]
        return re.sub(r"(, )?phase 1: \d+ epochs$", "", setting)
    from recipes.study.records import checkpoint_info

    return checkpoint_info(path)["setting"]


def _phase1(setting: str, epochs: int | None) -> str:
    """``setting``, and the phase-1 epochs when the gated run is phase 1 of a two-phase run."""
    if epochs is None:
        return setting
    return ", ".join(filter(None, (setting, f"phase 1: {epochs} epochs")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("budget")
    p.add_argument("--baseline", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--kept", help="kept-heads JSON (export's OUT.heads.json)")
    what.add_argument("--spec", help="the budget itself: K (encoder heads) or TYPE:K,...")
    p.set_defaults(func=cmd_budget)
    p = sub.add_parser("topk")
    p.add_argument("--scores", required=True)
    p.add_argument("--metric", required=True)
    p.add_argument("--budget", required=True)
    p.add_argument("--ascending", action="store_true")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_topk)
    p = sub.add_parser("michel")
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--budget", required=True)
    p.add_argument("--step", type=int, default=0, help="heads removed per step and type")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_michel)
    p = sub.add_parser("record")
    p.add_argument("--eval-dir", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--kept", required=True)
    p.add_argument("--seed", type=int)
    setting = p.add_mutually_exclusive_group()
    setting.add_argument("--setting", help="the report table's setting column (default: the seed)")
    setting.add_argument(
        "--phase2-of",
        help="the gated run's checkpoint whose structure phase 2 trained, or its phase-1 "
        "model.json: its setting, then 'phase 2 (seed S)'",
    )
    setting.add_argument(
        "--phase2-budget-of",
        metavar="NAME",
        help="the control was fine-tuned with the phase-2 budget of the two-phase run evaluated "
        "as NAME: setting 'phase-2 budget', NAME the fair reference",
    )
    p.add_argument("--baseline", help="NAME of the evaluated baseline the model was made from")
    p.add_argument("--reference", help="NAME of the fair reference (default: the baseline)")
    p.add_argument("--run-dir", help="the model's training run folder (published with it)")
    p.add_argument(
        "--selected",
        choices=("last",),
        help="the checkpoint is the run's last, not its best by validation nll (the default)",
    )
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("record-gated")
    p.add_argument("--eval-dir", required=True)
    p.add_argument("--checkpoint", required=True, help="the gated run's checkpoint_last.pt")
    p.add_argument("--setting", help="the report table's setting column (default: λ or budget)")
    p.add_argument(
        "--phase1-epochs",
        type=int,
        help="the run is phase 1 of the two-phase protocol, trained N epochs (setting says so)",
    )
    p.add_argument("--reference", help="NAME of the fair reference (default: the baseline)")
    p.set_defaults(func=cmd_record_gated)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
