"""Physically remove attention heads: smaller tensors, not masks.

After Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the
Heavy Lifting, the Rest Can Be Pruned", ACL 2019) close heads with L0 gates, a closed head
still costs its q/k/v projections and attention unless it is cut out. This module:

- folds the deterministic gate values into the columns of ``out_proj.weight``
  (Concat(g_h·head_h)·W_O = Concat(head_h)·(diag(g) ⊗ I_d)·W_O; the bias is untouched);
- slices the kept heads' rows out of q/k/v (weights and biases) and their columns out of
  ``out_proj``, in a state dict — so the same function prunes a gated checkpoint, a stock
  checkpoint plus a mask, or a top-k selection by any head score;
- rebuilds a model of the pruned shape before loading (fairseq's own lesson from RoBERTa head
  pruning: shrink modules to match the checkpoint, then load strictly). A layer whose heads
  are all removed becomes ``NoHeadAttention``: the output-projection bias, no q/k/v work.

The kept heads are recorded in the model config as ``kept_heads``: a JSON object
``{"enc-self": [[head, …] per layer], …}`` of original head indices; absent types keep all.
The same object records kept FFN neurons (Kwon et al. 2022, "A Fast Post-Training Pruning
Framework for Transformers", prune them with the heads) under ``"enc-ffn"`` / ``"dec-ffn"``:
original indices of the rows of ``fc1`` (columns of ``fc2``) kept per layer.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.sites import (
    FFN_SITES,
    SITES,
    get_attention,
    set_attention,
    site_layers,
)

if TYPE_CHECKING:
    from fairseq.modules import MultiheadAttention

KeptHeads = dict[str, list[list[int]]]
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class NoHeadAttention(nn.Module):
    """An attention layer with every head removed: its output is the out_proj bias."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.out_proj_bias = nn.Parameter(torch.zeros(embed_dim))
        self.num_heads = 0

    def forward(self, query: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor | None]:
        return self.out_proj_bias.expand_as(query), None  # (T, B, E)

    # the decoder layer asks every self-attention for its incremental buffer
    def _get_input_buffer(self, incremental_state) -> dict:
        return {}

    def _set_input_buffer(self, incremental_state, buffer) -> None:
        pass


def resize_attention(attn: MultiheadAttention, num_heads: int) -> nn.Module:
    """Give ``attn`` room for ``num_heads`` heads (fresh weights, to be loaded)."""
    if num_heads == 0:
        return NoHeadAttention(attn.out_proj.out_features)
    if attn.bias_k is not None:
        raise ValueError("pruning heads of attention with --add-bias-kv is not supported")
    width = num_heads * attn.head_dim
    attn.q_proj = nn.Linear(attn.q_proj.in_features, width, bias=attn.q_proj.bias is not None)
    attn.k_proj = nn.Linear(attn.kdim, width, bias=attn.k_proj.bias is not None)
    attn.v_proj = nn.Linear(attn.vdim, width, bias=attn.v_proj.bias is not None)
    bias = attn.out_proj.bias is not None
    attn.out_proj = nn.Linear(width, attn.out_proj.out_features, bias=bias)
    attn.num_heads, attn.embed_dim = num_heads, width
    attn._set_skip_embed_dim_check()  # the fused route checks embed_dim == query dim
    return attn


def resize_ffn(layer: nn.Module, width: int) -> None:
    """Give a transformer layer's FFN room for ``width`` neurons (fresh weights, to be loaded)."""
    if getattr(layer, "ffn_layernorm", None) is not None:
        raise ValueError("pruning FFN neurons of layers with --scale-fc is not supported")
    fc1, fc2 = layer.fc1, layer.fc2
    layer.fc1 = nn.Linear(fc1.in_features, width, bias=fc1.bias is not None)
    layer.fc2 = nn.Linear(width, fc2.out_features, bias=fc2.bias is not None)


def prune_ffn_state_dict(
    state: dict[str, Tensor],
    kept: dict[str, list[int]],
    scales: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Cut FFN neurons out of a transformer state dict.

    ``kept``: layer prefix (``decoder.layers.1``) → indices of the neurons (rows of ``fc1``,
    columns of ``fc2``) to keep, in the checkpoint's current numbering. ``scales``: prefix →
    a value per current neuron folded into ``fc2``'s columns (act_j·m_j·W2[:, j]); bias untouched.
    """
    out = dict(state)
    for prefix, keep in kept.items():
        rows = torch.tensor(keep, dtype=torch.long)
        w2 = state[f"{prefix}.fc2.weight"]  # (E, F)
        if scales is not None and prefix in scales:
            w2 = w2 * scales[prefix].to(w2)[None, :]
        out[f"{prefix}.fc1.weight"] = state[f"{prefix}.fc1.weight"][rows].clone()
        if f"{prefix}.fc1.bias" in state:
            out[f"{prefix}.fc1.bias"] = state[f"{prefix}.fc1.bias"][rows].clone()
        out[f"{prefix}.fc2.weight"] = w2[:, rows].clone()
    return out


def parse_kept_heads(value: str | None) -> KeptHeads:
    """``--kept-heads``: inline JSON or the path of a JSON file; empty → {}."""
    if not value:
        return {}
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            value = f.read()
    try:
        kept = json.loads(value)
        return {site: [list(map(int, layer)) for layer in layers] for site, layers in kept.items()}
    except json.JSONDecodeError as e:
        raise HeadpruneError(
            f"--kept-heads {value[:80]!r}: neither an existing JSON file nor inline JSON ({e})"
        ) from e
    except (AttributeError, TypeError, ValueError) as e:
        raise HeadpruneError(
            '--kept-heads: expected {"enc-self": [[head, ...] per layer], ...} as written by '
            f"fairseq-headprune export, got {value[:80]!r}"
        ) from e


def prune_state_dict(
    state: dict[str, Tensor],
    modules: dict[str, tuple[int, int]],
    kept: dict[str, list[int]],
    gates: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Cut heads out of a transformer state dict.

    ``modules``: attention prefix (``encoder.layers.0.self_attn``) → (num_heads, head_dim).
    ``kept``: prefix → original indices of the heads to keep (absent: keep all).
    ``gates``: prefix → gate values (H,) to fold into out_proj; their keys are removed.
    """
    out = {k: v for k, v in state.items() if not k.endswith(".head_gate.theta")}
    for prefix, (num_heads, head_dim) in modules.items():
        if num_heads == 0:  # already a NoHeadAttention
            continue
        keep = kept.get(prefix, list(range(num_heads)))
        cols = torch.tensor([h * head_dim + i for h in keep for i in range(head_dim)])
        cols = cols.long()  # (len(keep)·d,)
        w_out = state[f"{prefix}.out_proj.weight"]  # (E, H·d)
        if gates is not None and prefix in gates:
            w_out = w_out * gates[prefix].to(w_out).repeat_interleave(head_dim)[None, :]
        if not keep:
            for name in (*PROJECTIONS, "out_proj"):
                out.pop(f"{prefix}.{name}.weight", None)
                out.pop(f"{prefix}.{name}.bias", None)
            out[f"{prefix}.out_proj_bias"] = state[f"{prefix}.out_proj.bias"]
            continue
        for name in PROJECTIONS:
            out[f"{prefix}.{name}.weight"] = state[f"{prefix}.{name}.weight"][cols].clone()
            if f"{prefix}.{name}.bias" in state:
                out[f"{prefix}.{name}.bias"] = state[f"{prefix}.{name}.bias"][cols].clone()
        out[f"{prefix}.out_proj.weight"] = w_out[:, cols].clone()
    return out


def unprune_state_dict(
    state: dict[str, Tensor],
    full: dict[str, Tensor],
    modules: dict[str, tuple[int, int]],
    kept: dict[str, list[int]],
) -> dict[str, Tensor]:
    """The inverse of :func:`prune_state_dict`: put the kept heads back at their original
    indices of full-size tensors; removed heads get zero weights and biases.

    ``full``: a state dict of the unpruned architecture (for the shapes); ``modules``:
    attention prefix → (full num_heads, head_dim); ``kept``: prefix → original indices of the
    heads the pruned tensors hold, in order (absent: all). The result loads into the
    unpruned architecture and computes what the pruned model computes, since a removed
    head's out_proj columns are zero.
    """
    out = {k: v for k, v in state.items() if not k.endswith(".out_proj_bias")}
    for prefix, (num_heads, head_dim) in modules.items():
        keep = kept.get(prefix, list(range(num_heads)))
        if keep == list(range(num_heads)):
            continue
        cols = torch.tensor([h * head_dim + i for h in keep for i in range(head_dim)]).long()
        if not keep:  # a NoHeadAttention stores only the output bias
            out[f"{prefix}.out_proj.bias"] = state[f"{prefix}.out_proj_bias"].clone()
        for name in PROJECTIONS:
            for part in ("weight", "bias"):
                key = f"{prefix}.{name}.{part}"
                if key in full:
                    out[key] = torch.zeros_like(full[key])
                    if keep:
                        out[key][cols] = state[key]
        key = f"{prefix}.out_proj.weight"
        out[key] = torch.zeros_like(full[key])  # (E, H·d)
        if keep:
            out[key][:, cols] = state[key]
    return out


def shrink_to_kept(model: nn.Module, kept: KeptHeads) -> None:
    """Shrink ``model``'s attention modules to the kept heads' shapes, and its FFNs to the kept
    neurons' (``enc-ffn`` / ``dec-ffn``), checking ``kept`` first; the weights are loaded after."""
    for site, per_layer in kept.items():
        if site not in SITES + FFN_SITES:
            raise HeadpruneError(
                f"--kept-heads: unknown type {site!r}; allowed: {list(SITES + FFN_SITES)}"
            )
        rows = site_layers(model, site)
        if len(per_layer) != len(rows):
            raise HeadpruneError(
                f"--kept-heads: {site} lists {len(per_layer)} layers, the model has {len(rows)}"
            )
        for i, (layer, kept_units) in enumerate(zip(rows, per_layer)):
            if site in FFN_SITES:
                _keep_neurons(layer, site, kept_units)
            else:
                _keep_heads(layer, site, i, kept_units)


def _keep_neurons(layer: nn.Module, site: str, neurons: list[int]) -> None:
    """Resize ``layer``'s FFN for the kept ``neurons`` (original indices), after checking them."""
    width = layer.fc1.out_features
    if any(not 0 <= j < width for j in neurons) or len(set(neurons)) != len(neurons):
        raise HeadpruneError(f"--kept-heads: {site} names neurons outside 0..{width - 1} or twice")
    resize_ffn(layer, len(neurons))


def _keep_heads(layer: nn.Module, site: str, i: int, heads: list[int]) -> None:
    """Resize ``layer``'s ``site`` attention for the kept ``heads``, after checking them."""
    attn = get_attention(layer, site)
    bad = [h for h in heads if not 0 <= h < attn.num_heads]
    if bad or len(set(heads)) != len(heads):
        raise HeadpruneError(
            f"--kept-heads: {site} layer {i} names heads {heads}, but the layer has "
            f"heads 0..{attn.num_heads - 1}"
        )
    set_attention(layer, site, resize_attention(attn, len(heads)))
