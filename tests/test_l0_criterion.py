"""The L0 criterion: penalty value, and a weight independent of how a batch is split."""

import math

import pytest
import torch
from fairseq.data import LanguagePairDataset

from fairseq_headprune.gated_attention import head_gates
from fairseq_headprune.l0_criterion import LabelSmoothedCrossEntropyL0Criterion, l0_penalty
from tests.helpers import build_model


def _criterion(model_task, lam, normalization="sum"):
    return LabelSmoothedCrossEntropyL0Criterion(
        model_task, sentence_avg=False, label_smoothing=0.1, l0_lambda=lam,
        l0_penalty_normalization=normalization,
    )  # fmt: skip


class _Task:
    def __init__(self, d):
        self.target_dictionary = d


def _samples(d, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    eos = torch.tensor([d.eos()])

    def sentence(k):
        return torch.cat([torch.randint(d.nspecial, len(d), (int(k),), generator=g), eos])

    src = [sentence(k) for k in torch.randint(3, 8, (n,), generator=g)]
    tgt = [sentence(k) for k in torch.randint(3, 8, (n,), generator=g)]
    ds = LanguagePairDataset(src, [len(s) for s in src], d, tgt, [len(t) for t in tgt], d)
    return ds.collater([ds[i] for i in range(n)]), [
        ds.collater([ds[i] for i in idx]) for idx in (range(0, 2), range(2, n))
    ]


def test_penalty_is_sum_of_open_probabilities():
    model, _ = build_model()
    gates = [g for _, _, g in head_gates(model)]
    for i, g in enumerate(gates):
        g.theta.data.fill_((i - 2.0) / g.lr_scale)  # log α = i − 2
    shift = 0.33 * math.log(0.1 / 1.1)
    expected = sum(4 / (1 + math.exp(-(i - 2.0 - shift))) for i in range(len(gates)))
    assert l0_penalty(model).item() == pytest.approx(expected, rel=1e-5)
    assert l0_penalty(model, "layer-mean").item() == pytest.approx(expected / len(gates), rel=1e-5)


def _grad(model, criterion, batches):
    """What fairseq does: sum the micro-batch losses, divide gradients by the summed sample size."""
    model.zero_grad()
    total_size = 0
    for sample in batches:
        loss, sample_size, _ = criterion(model, sample)
        loss.backward()
        total_size += sample_size
    return torch.cat([g.theta.grad.clone() for _, _, g in head_gates(model)]) / total_size


def test_gate_gradient_is_independent_of_batch_split():
    """One worker with the whole batch == two workers / two micro-batches over the same data."""
    torch.manual_seed(0)
    model, d = build_model()
    model.eval()  # deterministic gates: the only difference is the split
    for _, _, g in head_gates(model):
        g.theta.data.uniform_(-1, 1)
    whole, halves = _samples(d)
    for lam in (0.0, 0.7):
        crit = _criterion(_Task(d), lam)
        torch.testing.assert_close(_grad(model, crit, [whole]), _grad(model, crit, halves))
    # and the penalty's share of the gradient is λ·∂L_C, whatever the batch
    crit0, crit1 = _criterion(_Task(d), 0.0), _criterion(_Task(d), 0.7)
    diff = _grad(model, crit1, halves) - _grad(model, crit0, halves)
    model.zero_grad()
    (0.7 * l0_penalty(model)).backward()
    expected = torch.cat([g.theta.grad for _, _, g in head_gates(model)])
    torch.testing.assert_close(diff, expected, atol=1e-6, rtol=1e-4)


def test_logging_outputs_report_open_heads():
    model, d = build_model()
    for site, _, g in head_gates(model):
        if site == "dec-enc":
            g.theta.data[:2] = -10.0
    model.eval()
    whole, _ = _samples(d)
    _, sample_size, log = _criterion(_Task(d), 0.5)(model, whole)
    assert log["open_enc_self"] / sample_size == 8
    assert log["open_dec_enc"] / sample_size == 8 - 4
    assert log["exp_open_dec_enc"] / sample_size < 8 - 3.9
