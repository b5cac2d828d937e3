"""Fixtures built once per test run: one tiny corpus and one converged-enough stock transformer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.export_helpers import write_gated
from tests.helpers import make_corpus, preprocess, train
from tests.recipe_helpers import SHARED, run_recipe

if os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs two workers on two cores: torch's default of a thread per core in
    # each would make the threads spin against each other (the subprocesses get
    # OMP_NUM_THREADS=1 from tests.helpers and tests.recipe_helpers for the same reason)
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


@pytest.fixture(scope="session")
def gated_checkpoint(stock_checkpoint, tmp_path_factory) -> Path:
    """The stock model as a gated_transformer with mixed open / fractional / closed gates."""
    return write_gated(stock_checkpoint, tmp_path_factory.mktemp("gated") / "gated.pt")


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    """The shared Multi30k files when present, else a small parallel corpus in their format."""
    if SHARED.is_dir():
        return SHARED
    folder = tmp_path_factory.mktemp("raw")
    for split, n in (("train", 300), ("val", 20), ("test_2016_flickr", 20),
                     ("test_2017_flickr", 20), ("test_2017_mscoco", 20)):  # fmt: skip
        (folder / f"{split}.en").write_text("".join(f"a dog runs {i} times .\n" for i in range(n)))
        (folder / f"{split}.de").write_text(
            "".join(f"ein hund rennt {i} mal .\n" for i in range(n))
        )
    return folder


@pytest.fixture(scope="session")
def quickstart_run(raw_dir, tmp_path_factory) -> tuple[Path, str]:
    """The quickstart's outputs (baseline, pruned run, their BLEU) and its stdout, made once."""
    work = tmp_path_factory.mktemp("quickstart")  # TINY has 8 encoder heads: keep 5
    return work, run_recipe("quickstart.sh", work, raw_dir, TARGET_HEADS="5", TARGET_WARMUP="2")


@pytest.fixture(scope="session")
def quickstart_work(quickstart_run) -> Path:
    return quickstart_run[0]


# the files that run the recipes on the quickstart's outputs, longest first
RECIPE_FILES = ("test_recipes.py", "test_full_study.py", "test_posttrain_recipe.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The recipe files first (a stable sort keeps every other order): they are the longest,
    about 18 worker-minutes together on 2 cores, most of the suite. Under scripts/test.sh's
    workers (--dist loadfile) a file runs whole on one worker, so they should start at once,
    not last; each worker that runs one builds its own quickstart (a fixture built once per
    test run is built once per worker)."""
    rank = {name: i for i, name in enumerate(RECIPE_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RECIPE_FILES)))
