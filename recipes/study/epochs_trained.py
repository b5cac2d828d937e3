"""Print how many epochs a fairseq-train run has completed, read from one of its checkpoints.

recipes/controls.sh trains the from-scratch control of Voita et al. 2019 (the pruned
structure trained with the baseline's recipe) for as many epochs as the baseline it is
compared with, which is where that baseline's own run ended (its ``checkpoint_last.pt``).
"""

from __future__ import annotations

import sys

from fairseq_headprune.checkpoint_io import load_checkpoint


def epochs_trained(path: str) -> int:
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


if __name__ == "__main__":
    print(epochs_trained(sys.argv[1]))
