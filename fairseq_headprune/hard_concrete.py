"""Hard Concrete gates for attention heads.

The stochastic gate of Louizos, Welling & Kingma 2018 ("Learning Sparse Neural Networks
through L0 Regularization", ICLR 2018), as used per attention head by Voita et al. 2019
("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest
Can Be Pruned", ACL 2019, section 6).

For a head with parameter log α, temperature β and stretch interval (l, r), l < 0 < 1 < r:

- training sample (one noise draw per head per forward pass, shared by the batch)::

      u ~ U(0, 1)
      s = σ((log u − log(1 − u) + log α) / β)
      g = clip(s · (r − l) + l, 0, 1)

- evaluation (deterministic) value::

      g = clip(σ(log α) · (r − l) + l, 0, 1)

- probability that the gate is non-zero, the L0 penalty term of the head::

      P(g ≠ 0) = σ(log α − β · ln(−l / r))

Learning rate of the gates. The gate's parameter is θ with log α = lr_scale · θ. Under Adam
every parameter moves by about the learning rate per step whatever its gradient's scale, so
a short fine-tuning at a weight-sized learning rate (say 700 updates at 5e-4) cannot move
log α from open (≈ 3) to closed (≈ −2.4); ``lr_scale`` lets the gates move ``lr_scale``
times faster than the weights inside fairseq's single optimizer. With lr_scale = 1, θ is
log α itself.

Gradient scale. θ's gradient reaches the optimizer multiplied by ``GRAD_SCALE`` (a tensor
hook). The raw gradient is lr_scale times the gradient in log α, and an exact head budget
(``budget``) adds a Lagrangian term that can be hundreds of times a weight's gradient; in
fairseq's single optimizer these would set the *global* ``--clip-norm`` and scale down every
weight's gradient (on Multi30k, a ``--target-heads 7`` run had 94–100 % of the updates in
most logging intervals clipped, gradient norm up to 294). Adam's step m / √v does not depend
on a constant gradient scale, so the gates learn as before while the clip norm is, in
effect, the weights' alone. The hook assumes an adaptive optimizer, as ``lr_scale`` does.

This module is pure torch: no fairseq import.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fairseq_headprune.errors import check_value

# Defaults of Voita et al.'s code (the-story-of-heads, lib/layers/concrete_gate.py).
DEFAULT_TEMPERATURE = 0.33
DEFAULT_STRETCH = (-0.1, 1.1)
# σ(3.0)·1.2 − 0.1 ≈ 1.04 ⇒ the deterministic gate is exactly 1, and ≈ 90% of training
# samples are exactly 1, so fine-tuning starts from the converged model's function.
DEFAULT_INIT_LOG_ALPHA = 3.0
# log α = lr_scale · θ. The default moves a gate about 0.01 per update at --lr 5e-4 under Adam:
# open (3.0) to closed (−2.4) in 540 updates, within a fine-tuning of 1–2k updates.
DEFAULT_LR_SCALE = 20.0
# The scale of gates whose saved config has none (θ = log α): how such checkpoints were trained.
LEGACY_LR_SCALE = 1.0
# θ's gradient is multiplied by this before the optimizer sees it (see the module docstring).
GRAD_SCALE = 1e-3
# Keeps log u and log(1 − u) finite.
_EPS = 1e-6


def check_gate_hparams(
    temperature: float,
    stretch: tuple[float, float],
    init_log_alpha: float = DEFAULT_INIT_LOG_ALPHA,
    lr_scale: float = 1.0,
) -> None:
    """Raise ``HeadpruneError`` naming the flag for a value the gate cannot use (NaN too)."""
    check_value("--head-gate-temperature", temperature, temperature > 0, "a number > 0")
    low, high = stretch
    interval = "(the stretch interval (l, r) must contain [0, 1] strictly)"
    check_value("--head-gate-stretch-low", low, low < 0.0, f"a number < 0 {interval}")
    check_value("--head-gate-stretch-high", high, high > 1.0, f"a number > 1 {interval}")
    check_value("--head-gate-init-log-alpha", init_log_alpha, True, "a finite number")
    check_value("--head-gate-lr-scale", lr_scale, lr_scale > 0, "a number > 0")


def scale_gradient(grad: torch.Tensor) -> torch.Tensor:
    """The gradient hook of the gates and the budget multipliers: × ``GRAD_SCALE``."""
    return grad * GRAD_SCALE


class HardConcreteGate(nn.Module):
    """One Hard Concrete gate per head; ``forward()`` returns the gate vector (num_heads,)."""

    def __init__(
        self,
        num_heads: int,
        temperature: float = DEFAULT_TEMPERATURE,
        stretch: tuple[float, float] = DEFAULT_STRETCH,
        init_log_alpha: float = DEFAULT_INIT_LOG_ALPHA,
        lr_scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_gate_hparams(temperature, stretch, init_log_alpha, lr_scale)
        self.temperature = float(temperature)
        self.low, self.high = float(stretch[0]), float(stretch[1])
        self.lr_scale = float(lr_scale)
        self.theta = nn.Parameter(torch.full((num_heads,), float(init_log_alpha) / lr_scale))

    @property
    def log_alpha(self) -> torch.Tensor:
        theta = self.theta.clone()  # a hook on a copy holds whatever the parameter becomes
        if theta.requires_grad:
            theta.register_hook(scale_gradient)
        return theta * self.lr_scale  # (H,)

    @property
    def num_heads(self) -> int:
        return self.theta.numel()

    def sample(self) -> torch.Tensor:
        """A differentiable training sample, one noise draw per head."""
        u = torch.rand_like(self.theta).clamp(_EPS, 1.0 - _EPS)  # (H,)
        s = torch.sigmoid((u.log() - (-u).log1p() + self.log_alpha) / self.temperature)
        return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def deterministic(self) -> torch.Tensor:
        """The evaluation value of every gate."""
        s = torch.sigmoid(self.log_alpha)
        return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)

    def prob_open(self) -> torch.Tensor:
        """P(g ≠ 0) per head: the expected L0 norm, differentiable in log α."""
        shift = self.temperature * math.log(-self.low / self.high)
        return torch.sigmoid(self.log_alpha - shift)

    def forward(self) -> torch.Tensor:
        return self.sample() if self.training else self.deterministic()

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, temperature={self.temperature}, "
            f"stretch=({self.low}, {self.high}), lr_scale={self.lr_scale}"
        )
