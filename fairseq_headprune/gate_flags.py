"""The defaults of the ``gated_transformer`` flags, readable without importing fairseq.

The model of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned", ACL 2019) is fairseq's transformer plus these
flags (defined in ``gated_transformer``). A checkpoint's saved configuration may lack some of
them (written before a flag existed, or by a stock ``transformer``); the model, the export
and the checkpoint readers all fill them in here, the same way.
"""

from __future__ import annotations

from fairseq_headprune.hard_concrete import (
    DEFAULT_INIT_LOG_ALPHA,
    DEFAULT_STRETCH,
    DEFAULT_TEMPERATURE,
    LEGACY_LR_SCALE,
)
from fairseq_headprune.sites import SITES

DEFAULT_SITES = ",".join(SITES)


def gate_defaults(args) -> None:
    """Fill in the gate flags (also for checkpoints saved before a flag existed).

    A new run gets ``--head-gate-lr-scale`` from its parser default (``DEFAULT_LR_SCALE``);
    a saved config without it was trained at ``LEGACY_LR_SCALE``, the default before.
    """
    defaults = {
        "head_gates": DEFAULT_SITES,
        "head_gate_temperature": DEFAULT_TEMPERATURE,
        "head_gate_stretch_low": DEFAULT_STRETCH[0],
        "head_gate_stretch_high": DEFAULT_STRETCH[1],
        "head_gate_init_log_alpha": DEFAULT_INIT_LOG_ALPHA,
        "head_gate_lr_scale": LEGACY_LR_SCALE,
        "allow_slow_gates": False,
        "kept_heads": None,
        "freeze_decoder": False,
        "train_shared_embeddings": False,
    }
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
