"""Time of post-training pruning (Kwon et al. 2022, "A Fast Post-Training Pruning Framework for
Transformers"), stage by stage, against the ten-minute goal for 2,000 calibration sentences.

Runs ``fairseq-headprune prune``'s own code (``posttrain.command.run_prune``) on a checkpoint
at each budget and with each ``--tune`` (the default weight refit, Kwon et al.'s mask tuning)
(with prune's other defaults: three search steps, units reselected with the weight refit)
and prints the time of each stage (loading and calibration batches; Fisher importance and
search; tuning; export) and the total.

    python benchmarks/bench_posttrain.py DATA --path CKPT [--budgets macs:0.8 macs:0.6]
        [--tune weights masks] [--calibration-sentences 2000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from fairseq_headprune.posttrain.command import add_prune_parser, run_prune

GOAL_SECONDS = 600.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="fairseq-preprocess output with the calibration subset")
    p.add_argument("--path", required=True, help="the checkpoint to prune")
    p.add_argument("--budgets", nargs="+", default=["macs:0.8", "macs:0.6"])
    p.add_argument("--tune", nargs="+", default=["weights", "masks"], help="prune --tune values")
    p.add_argument("--calibration-sentences", type=int, default=2000)
    args = p.parse_args()
    prune = argparse.ArgumentParser()
    add_prune_parser(prune.add_subparsers())
    print(f"torch threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        for budget in args.budgets:
            for tune in args.tune:
                out = Path(tmp) / "pruned.pt"
                flags = ["prune", args.data, "--path", args.path, "--budget", budget, "--force",
                         "--calibration-sentences", str(args.calibration_sentences),
                         "--tune", tune, "--out", str(out)]  # fmt: skip
                torch.manual_seed(1)
                report = run_prune(prune.parse_args(flags))
                stages = ", ".join(f"{k} {v:.1f} s" for k, v in report["seconds_by_stage"].items())
                total = report["seconds"]
                steps = f"{report['search_steps']} search steps" + (
                    ", units reselected" if report["reselected"] else ""
                )
                share = total / GOAL_SECONDS
                print(f"{budget} --tune {tune} ({steps}): {report['calibration_sentences']} "
                      f"sentences, {total:.1f} s ({share:.2f} of the 10-minute goal): "
                      f"{stages}")  # fmt: skip


if __name__ == "__main__":
    main()
