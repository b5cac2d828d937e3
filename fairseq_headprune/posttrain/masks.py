"""Mask variables on every head and FFN neuron of a fairseq encoder–decoder transformer.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", NeurIPS 2022)
put a mask variable, initially 1, on each head's output and on each FFN neuron. Here:

- a head's mask is the ``override`` of the plugin's ``HeadGate`` at the input of ``out_proj``
  (``gated_attention``): Concat(m_h·head_h)·W_O. A model that already has gates (a
  ``gated_transformer`` trained with them) keeps their deterministic values as a fixed factor;
- a neuron's mask multiplies the input of ``fc2`` (a forward pre-hook): Σ_j m_j·act_j·W2[:, j].

Units are keyed ``(site, layer)`` (``sites.Unit``): sites ``enc-self``, ``dec-self``,
``dec-enc`` (heads) and ``enc-ffn``, ``dec-ffn`` (neurons), the keys of ``macs.mac_terms``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fairseq_headprune.gated_attention import install_head_gate
from fairseq_headprune.sites import Unit, attention_modules, ffn_layers


class Masks:
    """One mask tensor per attention layer and FFN, installed in ``model``.

    ``values[unit]``: the masks (heads or neurons) of that layer; set them in place or assign a
    new tensor with :meth:`set`. ``requires_grad(True)`` makes them leaves whose ``.grad`` is
    ∂L/∂m after a backward pass.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.values: dict[Unit, Tensor] = {}
        self._base: dict[Unit, Tensor] = {}
        self._handles = []
        self._gates = {}
        for site, i, attn in attention_modules(model):
            if not attn.num_heads:
                continue
            gate = getattr(attn, "head_gate", None)
            if gate is None:
                gate = install_head_gate(attn)
                base = torch.ones(attn.num_heads)
            else:
                with torch.no_grad():
                    base = gate.eval().deterministic().detach().clone()
            self._base[site, i] = base
            self.values[site, i] = torch.ones(attn.num_heads)
            self._gates[site, i] = gate
        for site, i, layer in ffn_layers(model):
            if layer.fc1.out_features:
                self.values[site, i] = torch.ones(layer.fc1.out_features)
                self._handles.append(layer.fc2.register_forward_pre_hook(self._ffn_hook((site, i))))
        self._sync()

    def _sync(self) -> None:
        """Point every head gate's ``override`` at its current masks (× the fixed factor)."""
        for unit, gate in self._gates.items():
            base = self._base[unit]
            gate.override = (
                self.values[unit] if bool((base == 1).all()) else self.values[unit] * base
            )

    def _ffn_hook(self, unit: Unit):
        def hook(fc2: nn.Module, inputs: tuple[Tensor]) -> tuple[Tensor]:
            (x,) = inputs  # (T, B, F)
            return (x * self.values[unit].to(x.dtype),)

        return hook

    def units(self, sites: tuple[str, ...] | None = None) -> list[Unit]:
        return [u for u in self.values if sites is None or u[0] in sites]

    def base(self, unit: Unit) -> Tensor:
        """Fixed factor of a head's mask (a trained gate's deterministic value; else 1)."""
        return self._base.get(unit, torch.ones_like(self.values[unit]))

    def set(self, values: dict[Unit, Tensor]) -> None:
        for unit, v in values.items():
            self.values[unit] = v.detach().clone().float()
        self._sync()

    def requires_grad(self, flag: bool) -> None:
        for unit, v in self.values.items():
            self.values[unit] = v.detach().requires_grad_(flag)
        self._sync()

    def grads(self) -> dict[Unit, Tensor]:
        out = {}
        for unit, v in self.values.items():
            out[unit] = v.grad.detach().clone() if v.grad is not None else torch.zeros_like(v)
            v.grad = None
        return out

    def ones(self) -> dict[Unit, Tensor]:
        return {u: torch.ones_like(v) for u, v in self.values.items()}

    def snapshot(self) -> dict[Unit, Tensor]:
        return {u: v.detach().clone() for u, v in self.values.items()}
