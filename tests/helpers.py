"""Small stand-ins for fairseq's unshipped ``tests/utils.py``: tiny corpora and CLI runs."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_headprune")
BIN = Path(sys.executable).parent

# A tiny transformer: 2 encoder layers x 4 heads, 2 decoder layers, dim 16.
TINY_ARCH = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--share-all-embeddings",
]  # fmt: skip
# --data-buffer-size 0: no batch-prefetching thread. fairseq's is a daemon thread; when
# --max-update stops training mid-epoch it can still be collating batches at exit, and a daemon
# thread that retakes the GIL inside a torch op during interpreter shutdown is ended by
# pthread_exit, which aborts the process ("terminate called without an active exception")
# after the checkpoints are written.
TRAIN_COMMON = [
    "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
    "--optimizer", "adam", "--lr", "0.005", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "20", "--max-tokens", "500", "--dropout", "0.1",
    "--num-workers", "0", "--data-buffer-size", "0", "--no-progress-bar",
    "--log-format", "simple", "--log-interval", "5", "--seed", "1", "--cpu",
    "--no-epoch-checkpoints",
]  # fmt: skip


def cli(tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a console script of this venv (``fairseq-train``, ``fairseq-headprune`` …)."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PATH=path)
    exe = BIN / tool if (BIN / tool).exists() else tool
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{tool} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def make_corpus(
    folder: Path, n_train: int = 600, n_valid: int = 40, n_test: int = 24, seed: int = 0
) -> None:
    """A learnable toy translation task: target = source words mapped and reversed."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    mapping = {w: f"t{(i * 7) % 24}" for i, w in enumerate(words)}
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src, tgt = [], []
        for _ in range(n):
            sent = [rng.choice(words) for _ in range(rng.randint(3, 9))]
            src.append(" ".join(sent))
            tgt.append(" ".join(mapping[w] for w in reversed(sent)))
        (folder / f"{split}.src").write_text("\n".join(src) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(tgt) + "\n")


def preprocess(raw: Path, dest: Path) -> Path:
    cli(
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--joined-dictionary", "--destdir", dest, "--workers", "1",
    )  # fmt: skip
    return dest


def train(data: Path, save_dir: Path, *args: str, arch: str = "transformer") -> Path:
    cli(
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *TINY_ARCH,
        *TRAIN_COMMON, "--save-dir", save_dir, *args,
    )  # fmt: skip
    return save_dir / "checkpoint_last.pt"


def load_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def load_model(path: Path, data: Path) -> tuple:
    """The model (in eval mode) and task that fairseq's own loader builds from a checkpoint."""
    from fairseq import checkpoint_utils

    import fairseq_headprune  # noqa: F401  registers the plugin, as --user-dir does

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data)}
    )
    return model.eval(), task


def build_model(arch: str = "gated_transformer", *extra: str, vocab: int = 20):
    """A tiny fairseq model built through fairseq's own parser, task and arch registry."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    import fairseq_headprune  # noqa: F401  registers the plugin

    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    parser = options.get_training_parser()
    argv = ["/nonexistent", "--arch", arch, *TINY_ARCH, "--dropout", "0",
            "--attention-dropout", "0", "--task", "translation", *extra]  # fmt: skip
    args = options.parse_args_and_arch(parser, argv)
    task = TranslationTask(args, d, d)
    return task.build_model(args), d


def valid_log_line(epoch: int, nll: float, updates: int) -> str:
    """A validation line of ``train.log`` as fairseq-train prints it (nll rounded to 3 digits)."""
    return (
        f"2026-01-01 00:00:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | "
        f"loss {nll + 1.6:.3f} | nll_loss {nll} | ppl 4.9 | num_updates {updates}"
    )
