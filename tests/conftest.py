"""Session fixtures: one tiny corpus and one converged-enough stock transformer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_corpus, preprocess, train


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
