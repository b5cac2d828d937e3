"""``fairseq-headprune flags CKPT``: the architecture flags of a transformer checkpoint.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention", ACL 2019) prune a converged model
of a given shape: fine-tuning it as a ``gated_transformer`` needs the same ``--encoder-*`` /
``--decoder-*`` flags it was trained with. This subcommand prints them, one line, read back
from the checkpoint's saved configuration (``recipes/prune.sh`` uses it the same way):

    fairseq-train DATA --arch gated_transformer $(fairseq-headprune flags BASELINE.pt) ...
"""

from __future__ import annotations

import argparse

from fairseq_headprune.checkpoint_io import load_checkpoint, model_args

VALUE_FLAGS = [
    "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
    "dropout", "attention_dropout", "activation_dropout", "activation_fn",
]  # fmt: skip
BOOL_FLAGS = [
    "share_all_embeddings", "share_decoder_input_output_embed",
    "encoder_normalize_before", "decoder_normalize_before",
]  # fmt: skip


def model_flags(path: str) -> list[str]:
    """fairseq-train flags that rebuild the shape of the model saved at ``path``."""
    args = model_args(load_checkpoint(path))
    flags = []
    for name in VALUE_FLAGS:
        if getattr(args, name, None) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    flags += ["--" + n.replace("_", "-") for n in BOOL_FLAGS if getattr(args, n, False)]
    return flags


def cmd_flags(args: argparse.Namespace) -> None:
    print(" ".join(model_flags(args.checkpoint)))


def add_flags_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fairseq-headprune flags``."""
    p.add_argument("checkpoint", help="a transformer or gated_transformer checkpoint")
    p.set_defaults(func=cmd_flags)
