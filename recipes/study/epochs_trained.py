"""Epochs a fairseq-train run has completed, and where an interrupted run resumes.

recipes/controls.sh trains the from-scratch control of Voita et al. 2019 (the pruned
structure trained with the baseline's recipe) for as many epochs as the baseline it is
compared with, which is where that baseline's own run ended (its ``checkpoint_last.pt``).

recipes/finetune_pruned.sh (phase 2 of the two-phase protocol and the controls' fine-tuning)
and recipes/train_baseline.sh stop after ``--patience`` epochs without a better validation
nll. fairseq-train keeps that counter in memory only
(``fairseq_cli.train.should_stop_early``): a resumed run counts again from its first
validation and can train up to PATIENCE epochs more than an uninterrupted one, which would
break the equal fine-tuning budget. So an interrupted run resumes one epoch at a time and
the recipes apply the rule themselves (``--next-epoch``; ``train_resumable`` in
recipes/lib/common.sh), on the validation nll per epoch in the run's ``train.log``. The
resumed run trains the same epochs and updates; its weights are not bit-identical to an
uninterrupted run's, as fairseq groups the sentences into batches anew when it starts
(seeded by the epoch it starts with).

    python -m recipes.study.epochs_trained CHECKPOINT
    python -m recipes.study.epochs_trained --next-epoch RUN_DIR --patience N --max-epoch M
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fairseq_headprune.checkpoint_io import load_checkpoint
from recipes.study.training import validation_curve


def epochs_trained(path: str | Path) -> int:
    """Completed epochs of the run that saved ``path``.

    fairseq stores the epoch iterator's position: after the last batch of epoch N, epoch
    N + 1 at iteration 0 (N epochs complete); in the middle of epoch N, epoch N at its
    iteration (N − 1 complete). Both are the stored epoch − 1.
    """
    state = load_checkpoint(path)
    position = (state.get("extra_state") or {}).get("train_iterator")
    if not position:
        raise SystemExit(f"{path}: no training position (not a fairseq-train checkpoint)")
    return int(position["epoch"]) - 1


def next_epoch(run_dir: str | Path, patience: int, max_epoch: int) -> int:
    """The epoch an interrupted run of ``run_dir`` trains next, 0 when it is complete.

    Complete: ``max_epoch`` epochs done, or (``patience`` > 0) the last ``patience`` epochs
    did not improve on the best one, where fairseq-train stops an uninterrupted run (it
    stops after epoch e when e − the last improving epoch ≥ patience; see
    ``last_improvement``).
    """
    run = Path(run_dir)
    done = epochs_trained(run / "checkpoint_last.pt")
    if done >= max_epoch:
        return 0
    if patience > 0 and done - last_improvement(run, done) >= patience:
        return 0
    return done + 1


def last_improvement(run: Path, done: int) -> int:
    """The last of the first ``done`` epochs whose validation nll was lower than every earlier
    one's: the first epoch with the lowest nll. fairseq's patience counts an equal nll as no
    better (``<``), on the nll rounded to 3 digits as ``train.log`` prints it, so ties are not
    rare; ``checkpoint_best.pt`` is saved on a tie too (``<=``) and can be a later epoch. From
    ``run/train.log`` (the last line of an epoch the log repeats); where the log lacks an
    epoch, the epoch of ``checkpoint_best.pt``."""
    log = run / "train.log"
    curve = [c for c in validation_curve(log) if c[0] <= done] if log.is_file() else []
    if [c[0] for c in curve] == list(range(1, done + 1)):
        return min(curve, key=lambda c: (c[2], c[0]))[0]
    best = run / "checkpoint_best.pt"
    return epochs_trained(best) if best.exists() else done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", nargs="?", help="print the epochs it has completed")
    parser.add_argument(
        "--next-epoch", metavar="RUN_DIR", help="print the epoch RUN_DIR resumes with (0: done)"
    )
    parser.add_argument("--patience", type=int, default=0, help="fairseq-train's --patience")
    parser.add_argument("--max-epoch", type=int, help="fairseq-train's --max-epoch")
    args = parser.parse_args(argv)
    if args.next_epoch:
        if args.max_epoch is None:
            parser.error("--next-epoch needs --max-epoch")
        print(next_epoch(args.next_epoch, args.patience, args.max_epoch))
    elif args.checkpoint:
        print(epochs_trained(args.checkpoint))
    else:
        parser.error("give a CHECKPOINT or --next-epoch RUN_DIR")


if __name__ == "__main__":
    main()
