"""Print the architecture flags of a fairseq transformer checkpoint, for fairseq-train.

Lets recipes/prune.sh rebuild the baseline's shape as a ``gated_transformer`` without the
user repeating the flags (Voita et al. 2019 prune a converged model of a given shape).
"""

from __future__ import annotations

import sys

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
    args = model_args(load_checkpoint(path))
    flags = []
    for name in VALUE_FLAGS:
        if getattr(args, name, None) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    flags += ["--" + n.replace("_", "-") for n in BOOL_FLAGS if getattr(args, n, False)]
    return flags


if __name__ == "__main__":
    print(" ".join(model_flags(sys.argv[1])))
