"""Per-head Hard Concrete gates at the input of fairseq's attention output projection.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019) multiply each head's output by its gate before
the heads are mixed: MultiHead(Q, K, V) = Concat(g_1·head_1, …, g_H·head_H) W_O.

In fairseq's ``MultiheadAttention`` that seam is the input of ``out_proj``, of shape
(T, B, H·d), whose columns h·d:(h+1)·d belong to head h. Two facts decide the design:

- the fused route (``F.multi_head_attention_forward``), taken for self-attention during
  training and validation, hands ``out_proj.weight`` straight to PyTorch: no per-head tensor
  exists there and hooks on ``out_proj`` never fire. ``_set_skip_embed_dim_check()`` makes
  every call take the explicit route, where ``self.out_proj(attn)`` is called;
- a forward pre-hook on ``out_proj`` then sees every head's output in training, validation,
  full and incremental decoding, without a copy of ``forward`` and with state-dict keys
  identical to a stock transformer's (the gate adds ``<attn>.head_gate.theta``).

:func:`head_gates` and :func:`gates_by_name` find the gates of a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.hard_concrete import HardConcreteGate
from fairseq_headprune.sites import attention_modules

# observer(head_outputs (T, B, H, d), gate (H,)) -> None; used by the head scorers.
HeadObserver = Callable[[Tensor, Tensor], None]


class HeadGate(HardConcreteGate):
    """A Hard Concrete gate per head that scales the heads' outputs before ``out_proj``.

    ``override``: fixed gate values (H,) used instead of the gate (masks, ablations, and a
    leaf tensor whose gradient is ∂L/∂g for importance scores). ``observer``: called with
    the per-head outputs and the gate values of every forward pass.
    """

    def __init__(self, num_heads: int, **gate_kwargs) -> None:
        super().__init__(num_heads, **gate_kwargs)
        self.override: Tensor | None = None
        self.observer: HeadObserver | None = None

    def values(self) -> Tensor:
        """The gate values this forward pass uses: override, training sample or eval value."""
        return self.override if self.override is not None else self()

    def pre_out_proj(self, out_proj: torch.nn.Module, inputs: tuple[Tensor]) -> tuple[Tensor]:
        """Forward pre-hook of ``out_proj``: Concat(head_h) → Concat(g_h · head_h)."""
        (x,) = inputs  # (T, B, H·d)
        heads = x.unflatten(-1, (self.num_heads, -1))  # (T, B, H, d)
        gate = self.values().to(heads.dtype)  # (H,)
        if self.observer is not None:
            self.observer(heads, gate)
        return ((heads * gate[:, None]).flatten(-2),)  # (T, B, H·d)


def install_head_gate(attn: MultiheadAttention, **gate_kwargs) -> HeadGate:
    """Give ``attn`` a ``head_gate`` child that scales each head's output; return the gate."""
    if getattr(attn, "use_xformers", False):
        raise HeadpruneError(
            "head gates do not support xFormers attention: drop --*-xformers-att-config"
        )
    if hasattr(attn, "head_gate"):
        raise ValueError("this attention module already has a head gate")
    attn.head_gate = HeadGate(attn.num_heads, **gate_kwargs)
    # Take the explicit route in every mode, where out_proj sees the (T, B, H·d) heads.
    attn._set_skip_embed_dim_check()
    attn.out_proj.register_forward_pre_hook(attn.head_gate.pre_out_proj)
    return attn.head_gate


def head_gates(model: nn.Module) -> Iterator[tuple[str, int, HeadGate]]:
    """Yield ``(site, layer index, gate)`` for every gated attention module."""
    for site, i, attn in attention_modules(model):
        gate = getattr(attn, "head_gate", None)
        if gate is not None:
            yield site, i, gate


def gates_by_name(model: nn.Module) -> Iterator[tuple[str, HeadGate]]:
    """Yield ``(module name, gate)`` for every head gate, through any DDP wrapper."""
    for name, module in model.named_modules():
        if isinstance(module, HeadGate):
            yield name, module
