"""Why a checkpoint does not fit the model being built: one line naming the flag to change.

Part of fairseq-headprune (Voita et al. 2019, "Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"). ``gated_transformer``
checks a checkpoint's tensors against its own before fairseq's strict loading, whose own
message ("please ensure that the architectures match") names no flag. A tensor of an
attention module that differs only in its number of heads is a physically pruned checkpoint
(``fairseq-headprune export``) or a ``--kept-heads`` file that does not fit it; any other
difference is another model size or vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from fairseq.modules import MultiheadAttention

from fairseq_headprune.errors import HeadpruneError

# The axis of each attention tensor that runs over heads (× head_dim, or 1 for the gate).
_HEAD_AXIS = {
    "q_proj.weight": 0,
    "q_proj.bias": 0,
    "k_proj.weight": 0,
    "k_proj.bias": 0,
    "v_proj.weight": 0,
    "v_proj.bias": 0,
    "out_proj.weight": 1,
    "head_gate.theta": 0,
}


def heads_in_checkpoint(
    key: str, shape: torch.Size, own_shape: torch.Size, attn: MultiheadAttention
) -> int | None:
    """The checkpoint's head count for ``key`` if only that count differs from the model's."""
    axis = _HEAD_AXIS.get(key.rsplit(".", 2)[-2] + "." + key.rsplit(".", 1)[-1])
    if axis is None or len(shape) != len(own_shape):
        return None
    if any(a != b for i, (a, b) in enumerate(zip(shape, own_shape)) if i != axis):
        return None
    per_head = 1 if key.endswith("head_gate.theta") else attn.head_dim
    return shape[axis] // per_head if shape[axis] % per_head == 0 else None


def check_fit(
    own: Mapping[str, torch.Tensor],
    state_dict: Mapping[str, torch.Tensor],
    prefix: str,
    attention: Mapping[str, tuple[str, int, MultiheadAttention]],
    kept_heads: str | None,
) -> None:
    """Raise ``HeadpruneError`` for the first checkpoint tensor whose shape the model lacks.

    ``own``: the model's state dict (keys without ``prefix``); ``attention``: the prefixed
    name of every attention module → (attention type, layer, module); ``kept_heads``: the
    model's ``--kept-heads`` value, if any.
    """
    own = {prefix + k: v for k, v in own.items()}
    for key, tensor in state_dict.items():
        if key not in own or not torch.is_tensor(tensor) or tensor.shape == own[key].shape:
            continue
        attn_name = key.rsplit(".", 2)[0]
        if attn_name in attention:
            site, layer, attn = attention[attn_name]
            n = heads_in_checkpoint(key, tensor.shape, own[key].shape, attn)
            if n is not None:
                raise HeadpruneError(_heads_message(site, layer, n, attn.num_heads, kept_heads))
        raise HeadpruneError(
            f"checkpoint tensor {key} has shape {tuple(tensor.shape)} but this model's "
            f"has {tuple(own[key].shape)}: the checkpoint was trained with other "
            "dimensions; pass its --encoder/--decoder-embed-dim, -ffn-embed-dim, "
            "-attention-heads and vocabulary (or use its own --arch preset)"
        )
    missing = sorted(k for k in own if k not in state_dict)
    if missing:
        raise HeadpruneError(
            f"checkpoint lacks {len(missing)} tensors of this model (e.g. {missing[0]}): "
            "it has fewer layers or another architecture; check --encoder-layers / "
            "--decoder-layers"
        )


def _heads_message(site: str, layer: int, n_ckpt: int, n_model: int, kept_heads) -> str:
    if kept_heads:
        return (
            f"--kept-heads does not fit the checkpoint: {site} layer {layer} has {n_ckpt} "
            f"heads in the checkpoint and {n_model} in --kept-heads {kept_heads}; pass the "
            "PRUNED.heads.json that fairseq-headprune export wrote beside this checkpoint"
        )
    return (
        f"the checkpoint is physically pruned ({site} layer {layer} has {n_ckpt} heads, this "
        f"model {n_model}): build its shape with --kept-heads PRUNED.heads.json, the file "
        "fairseq-headprune export wrote beside it"
    )
