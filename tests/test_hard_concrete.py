"""The Hard Concrete gate against independent formulas (Louizos et al. 2018)."""

import math

import numpy as np
import pytest
import torch

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.hard_concrete import GRAD_SCALE, HardConcreteGate

BETA, L, R = 0.33, -0.1, 1.1


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("log_alpha", [-3.0, -0.5, 0.0, 1.0, 3.0])
def test_sample_range_and_open_probability(log_alpha):
    torch.manual_seed(0)
    gate = HardConcreteGate(1, init_log_alpha=log_alpha)
    samples = torch.stack([gate.sample() for _ in range(20000)]).squeeze(1)
    assert samples.min() >= 0 and samples.max() <= 1
    # Monte Carlo estimate of P(g != 0) vs the closed form σ(log α − β ln(−l/r)).
    expected = _sigmoid(log_alpha - BETA * math.log(-L / R))
    assert abs((samples > 0).float().mean().item() - expected) < 0.015
    assert gate.prob_open().item() == pytest.approx(expected, abs=1e-6)
    # P(g == 1) = P(s > (1 − l)/(r − l)), also in closed form.
    t = (1 - L) / (R - L)
    p_one = 1 - _sigmoid(BETA * math.log(t / (1 - t)) - log_alpha)
    assert abs((samples == 1).float().mean().item() - p_one) < 0.015


def test_deterministic_value():
    theta = torch.tensor([-4.0, -1.0, 0.0, 0.5, 2.0, 5.0])
    gate = HardConcreteGate(6)
    gate.theta.data.copy_(theta)
    expected = np.clip(_sigmoid(theta.numpy()) * (R - L) + L, 0, 1)
    np.testing.assert_allclose(gate.deterministic().detach().numpy(), expected, atol=1e-6)
    gate.eval()
    assert torch.equal(gate(), gate.deterministic())


def test_default_gates_start_open_and_train_mode_samples():
    gate = HardConcreteGate(8)
    assert torch.equal(gate.deterministic(), torch.ones(8))
    gate.train()
    torch.manual_seed(0)
    assert not torch.equal(torch.stack([gate() for _ in range(50)]), torch.ones(50, 8))


def test_gradients_reach_theta_and_lr_scale():
    gate = HardConcreteGate(4, init_log_alpha=0.5, lr_scale=10.0)
    assert gate.theta.detach().tolist() == pytest.approx([0.05] * 4)
    assert gate.log_alpha.detach().tolist() == pytest.approx([0.5] * 4)
    (gate.sample().sum() + gate.prob_open().sum()).backward()
    assert gate.theta.grad is not None and (gate.theta.grad != 0).all()
    # θ's gradient is lr_scale × GRAD_SCALE × the gradient in log α
    gate.theta.grad = None
    gate.prob_open().sum().backward()
    log_alpha = torch.full((4,), 0.5, requires_grad=True)
    shift = gate.temperature * math.log(-gate.low / gate.high)
    torch.sigmoid(log_alpha - shift).sum().backward()
    torch.testing.assert_close(gate.theta.grad, 10.0 * GRAD_SCALE * log_alpha.grad)


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"temperature": 0.0}, "--head-gate-temperature"),
        ({"stretch": (0.0, 1.1)}, "--head-gate-stretch"),
        ({"stretch": (-0.1, 0.9)}, "--head-gate-stretch"),
        ({"lr_scale": -1.0}, "--head-gate-lr-scale"),
        ({"lr_scale": float("inf")}, "--head-gate-lr-scale inf"),
        ({"temperature": float("nan")}, "--head-gate-temperature nan"),
        ({"init_log_alpha": float("nan")}, "--head-gate-init-log-alpha nan"),
    ],
)
def test_bad_hyperparameters_name_the_flag(kwargs, flag):
    with pytest.raises(HeadpruneError, match=flag):
        HardConcreteGate(2, **kwargs)
