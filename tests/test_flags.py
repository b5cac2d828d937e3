"""``fairseq-headprune flags CKPT``: the model flags that rebuild a checkpoint's shape."""

from __future__ import annotations

from tests.helpers import TINY_ARCH, cli


def test_flags_give_back_the_shape_the_model_was_trained_with(stock_checkpoint):
    printed = cli("fairseq-headprune", "flags", stock_checkpoint).stdout.split()
    for flag, value in zip(TINY_ARCH[0:-1:2], TINY_ARCH[1::2]):  # --encoder-layers 2 ...
        assert printed[printed.index(flag) + 1] == value, flag
    assert "--share-all-embeddings" in printed and "--dropout" in printed
    assert "--encoder-normalize-before" not in printed  # post-norm: the flag is absent


def test_flags_of_a_missing_checkpoint_is_an_error(tmp_path):
    proc = cli("fairseq-headprune", "flags", tmp_path / "none.pt", check=False)
    assert proc.returncode != 0 and "none.pt" in proc.stderr
