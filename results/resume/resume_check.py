"""Is a fairseq-train run resumed from checkpoint_last.pt the run it would have been?

The recipes (Voita et al. 2019's study, docs/results.md) are resumable and the long runs of
this project were stopped and resumed across sessions. This script measures, on a tiny model
and the tests' toy corpus, what resuming changes: it trains 3 epochs in one process and
2 + 1 epochs in two processes (dropout 0, so nothing random remains but the data order),
checks that the two runs' states after epoch 2 are identical, prints epoch 3's per-update
training loss of both, and compares the batches fairseq builds for epoch 1 and epoch 3.

    .venv/bin/python results/resume/resume_check.py [WORK_DIR]
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli, make_corpus, preprocess  # noqa: E402


def train_args(data: Path) -> list[str]:
    """The tests' tiny stock transformer, dropout 0, an epoch checkpoint each epoch."""
    common = [a for a in TRAIN_COMMON if a != "--no-epoch-checkpoints"]
    return [str(data), "--user-dir", str(USER_DIR), "--arch", "transformer", *TINY_ARCH,
            *common, "--dropout", "0", "--log-interval", "1"]  # fmt: skip


def train(data: Path, save_dir: Path, epochs: int) -> list[str]:
    """fairseq-train the tiny model; return epoch 3's per-update and validation loss."""
    proc = cli(
        "fairseq-train", *train_args(data), "--save-dir", save_dir, "--max-epoch", str(epochs)
    )
    out = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if "epoch 003:" in line:
            out.append(line.split("| ")[-1].split(", ppl")[0])
        elif "valid on" in line and "epoch 003" in line:
            out.append("epoch 003 validation " + line.split("| loss ")[1].split(" ")[0])
    return out


def batches(data: Path, *epochs: int) -> list[list[tuple[int, ...]]]:
    """The batches (sentence ids) fairseq-train builds when a process starts at each epoch."""
    from fairseq import options, tasks

    logging.getLogger("fairseq").setLevel(logging.WARNING)
    args = options.parse_args_and_arch(options.get_training_parser(), train_args(data))
    task = tasks.setup_task(args)
    task.load_dataset("train")
    out = []
    for epoch in epochs:
        itr = task.get_batch_iterator(
            task.dataset("train"),
            max_tokens=args.max_tokens,
            max_positions=task.max_positions(),  # the model's are the same, 1024
            required_batch_size_multiple=args.required_batch_size_multiple,
            seed=args.seed,
            epoch=epoch,
            disable_iterator_cache=True,
        )
        out.append([tuple(sorted(b.tolist())) for b in itr.frozen_batches])
    return out


def main(work: Path) -> None:
    if not (work / "bin").exists():
        make_corpus(work / "raw")
        preprocess(work / "raw", work / "bin")
    straight = train(work / "bin", work / "straight", 3)
    train(work / "bin", work / "resumed", 2)
    resumed = train(work / "bin", work / "resumed", 3)

    a = torch.load(work / "straight" / "checkpoint2.pt", weights_only=False)
    b = torch.load(work / "resumed" / "checkpoint2.pt", weights_only=False)
    weight_diff = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    adam_diff = max(
        (sa[p][k] - sb[p][k]).abs().max().item() for p in sa for k in sa[p] if k != "step"
    )
    print(f"after epoch 2: max |weight diff| {weight_diff}, max |Adam state diff| {adam_diff}")
    print(f"{'epoch 3, one process':40s} | epoch 3, resumed after epoch 2")
    for x, y in zip(straight, resumed):
        print(f"{x:40s} | {y}")

    first, third = batches(work / "bin", 1, 3)
    shared = len(set(first) & set(third))
    print(
        f"batches built at epoch 1: {len(first)}, at epoch 3: {len(third)}, identical: {shared}; "
        f"sizes equal: {sorted(map(len, first)) == sorted(map(len, third))}"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
