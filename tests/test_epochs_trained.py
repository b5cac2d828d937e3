"""recipes/study/epochs_trained.py: completed epochs, and where an interrupted fine-tuning
resumes so that it stops where fairseq-train's --patience stops an uninterrupted run."""

import subprocess

import pytest
import torch

from recipes.study.epochs_trained import epochs_trained, next_epoch
from tests.helpers import BIN, REPO, valid_log_line


def save(path, epoch: int, iteration: int = 0) -> None:
    """A checkpoint as fairseq-train saves it: the epoch iterator's position in extra_state."""
    position = {"epoch": epoch, "iterations_in_epoch": iteration, "shuffle": True}
    torch.save({"model": {}, "extra_state": {"train_iterator": position}}, path)


def uninterrupted_stop(losses: list[float], patience: int, max_epoch: int) -> int:
    """The epoch after which fairseq_cli.train.should_stop_early ends a run (its rule,
    written out independently: stop once `patience` validations did not beat the best)."""
    best, runs = None, 0
    for epoch, loss in enumerate(losses[:max_epoch], 1):
        if best is None or loss < best:
            best, runs = loss, 0
        else:
            runs += 1
            if patience > 0 and runs >= patience:
                return epoch
    return min(len(losses), max_epoch)


def test_epochs_trained_reads_the_iterator_position(tmp_path):
    save(tmp_path / "end.pt", epoch=9)  # after the last batch of epoch 8
    save(tmp_path / "middle.pt", epoch=9, iteration=40)  # in the middle of epoch 9
    assert epochs_trained(tmp_path / "end.pt") == 8
    assert epochs_trained(tmp_path / "middle.pt") == 8
    torch.save({"model": {}}, tmp_path / "bare.pt")
    with pytest.raises(SystemExit, match="no training position"):
        epochs_trained(tmp_path / "bare.pt")


def write_log(path, losses: list[float]) -> None:
    """train.log's validation lines, 136 updates an epoch."""
    lines = [valid_log_line(e, loss, 136 * e) for e, loss in enumerate(losses, 1)]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_resumed_one_epoch_at_a_time_stops_where_the_uninterrupted_run_does(tmp_path, patience):
    # epoch 8 ties epoch 6: no improvement for fairseq's patience, a new checkpoint_best.pt
    losses = [3.0, 2.5, 2.4, 2.45, 2.41, 2.39, 2.42, 2.39, 2.44, 2.5, 2.6, 2.7]
    max_epoch = 11
    stop = uninterrupted_stop(losses, patience, max_epoch)
    assert stop == {0: 11, 1: 4, 2: 5, 3: 9}[patience]  # the losses exercise the rule
    for done in range(1, stop + 1):  # interrupted after epoch `done`, as saved then
        best_epoch = min(range(1, done + 1), key=lambda e: (losses[e - 1], -e))  # ties: later
        save(tmp_path / "checkpoint_last.pt", done + 1)
        save(tmp_path / "checkpoint_best.pt", best_epoch + 1)
        write_log(tmp_path / "train.log", losses[:done])
        # nothing more to train where the uninterrupted run ended, else the next epoch (the
        # recipe then asks again)
        expected = 0 if done == stop else done + 1
        assert next_epoch(tmp_path, patience, max_epoch) == expected, (patience, done)


def test_without_the_log_the_best_checkpoint_gives_the_last_improvement(tmp_path):
    save(tmp_path / "checkpoint_last.pt", 9)  # 8 epochs done
    save(tmp_path / "checkpoint_best.pt", 6)  # best after epoch 5
    assert next_epoch(tmp_path, 3, 30) == 0
    assert next_epoch(tmp_path, 4, 30) == 9
    write_log(tmp_path / "train.log", [2.5, 2.4, 2.3])  # a log that lacks epochs 4-8
    assert next_epoch(tmp_path, 3, 30) == 0


def test_command_line(tmp_path):
    save(tmp_path / "checkpoint_last.pt", 6)
    save(tmp_path / "checkpoint_best.pt", 3)
    command = [str(BIN / "python"), "-m", "recipes.study.epochs_trained"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(command + list(args), capture_output=True, text=True, cwd=REPO)

    assert run(str(tmp_path / "checkpoint_last.pt")).stdout == "5\n"
    args = ["--next-epoch", str(tmp_path), "--max-epoch", "30"]
    assert run(*args, "--patience", "3").stdout == "0\n"  # epochs 3, 4, 5 after the best, 2
    assert run(*args, "--patience", "4").stdout == "6\n"
    assert "--next-epoch needs --max-epoch" in run("--next-epoch", str(tmp_path)).stderr
