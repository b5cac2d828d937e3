"""Fixtures built once per test run: one tiny corpus and one converged-enough stock transformer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import make_corpus, preprocess, train

if os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs two workers on two cores: torch's default of a thread per core in
    # each would make the threads spin against each other (the subprocesses get
    # OMP_NUM_THREADS=1 from tests.helpers and test_recipes.py for the same reason)
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_corpus(root / "raw")
    return preprocess(root / "raw", root / "bin")


@pytest.fixture(scope="session")
def stock_checkpoint(tiny_data, tmp_path_factory) -> Path:
    """A stock ``transformer`` trained for a few epochs: the model users start pruning from."""
    save = tmp_path_factory.mktemp("stock")
    return train(tiny_data, save, "--max-epoch", "6", "--criterion", "label_smoothed_cross_entropy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The recipe tests first (a stable sort keeps every other order): they are the longest
    file (about 11 of the suite's 18 minutes on 2 cores), and under scripts/test.sh's workers
    (--dist loadfile) a file runs whole on one worker, so it should start at once, not last."""
    items.sort(key=lambda item: item.path.name != "test_recipes.py")
