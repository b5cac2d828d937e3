"""fairseq checkpoints load under torch's safe loading once the plugin is imported."""

import subprocess
import sys

import torch
from fairseq import checkpoint_utils

import fairseq_headprune  # noqa: F401
from fairseq_headprune.checkpoint_safety import checkpoint_globals


def _globals_in(path) -> set:
    """Every non-default global of a checkpoint (with the plugin's allow-list lifted)."""
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        return set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    finally:
        torch.serialization.add_safe_globals(allowed)


def _names(classes) -> set:
    return {f"{c.__module__}.{c.__qualname__}" for c in classes}


def test_allow_list_covers_saved_and_broadcast_checkpoints(stock_checkpoint, tmp_path):
    saved = _globals_in(stock_checkpoint)
    # what fairseq's trainer broadcasts to other ranks: load_checkpoint_to_cpu's state
    torch.save(checkpoint_utils.load_checkpoint_to_cpu(str(stock_checkpoint)), tmp_path / "b.pt")
    broadcast = _globals_in(tmp_path / "b.pt")
    assert "omegaconf.dictconfig.DictConfig" in broadcast
    assert "argparse.Namespace" in saved
    assert (saved | broadcast) <= _names(checkpoint_globals())
    torch.load(stock_checkpoint, weights_only=True)  # safe loading, no error


class Foreign:
    pass


def test_safe_loading_stays_on_for_other_classes(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"x": Foreign()}, path)
    code = f"import fairseq_headprune, torch; torch.load({str(path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    # refused in one line naming the class, never advising to turn safe loading off
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: refused to load") and "Foreign)" in last
    assert "weights_only" not in proc.stderr


def test_without_the_plugin_stock_loading_fails(stock_checkpoint):
    # the reason the plugin exists: plain torch >= 2.6 refuses fairseq checkpoints
    code = f"import torch; torch.load({str(stock_checkpoint)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "argparse.Namespace" in proc.stderr
