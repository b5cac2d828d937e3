"""The post-training pruner's search (Kwon et al. 2022, §4.1–4.2): the budget holds, every
decoder–encoder attention layer keeps a head, the rearrangement lowers its loss estimate,
and ``--search-steps`` reaches the budget in nested searches on the model pruned so far."""

from argparse import Namespace

import pytest
import torch

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.macs import mac_terms
from fairseq_headprune.posttrain import search
from fairseq_headprune.posttrain.fisher import calibration_batches, fisher
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.posttrain.search import (
    pruned_loss,
    rearrange,
    search_cost,
    search_heads,
    step_targets,
)
from fairseq_headprune.sites import UNIT_SITES
from tests.helpers import load_model


def test_search_respects_the_budget_and_keeps_a_cross_attention_head():
    g = torch.Generator().manual_seed(0)
    importance = {(s, i): torch.rand(4, generator=g) for s in ("enc-self", "dec-self")
                  for i in range(2)}  # fmt: skip
    importance |= {("dec-enc", i): torch.full((4,), 1e-6) for i in range(2)}  # unimportant
    importance |= {(s, i): torch.rand(16, generator=g) for s in ("enc-ffn", "dec-ffn")
                   for i in range(2)}  # fmt: skip
    cost = {u: (3.0 if u[0] in ("enc-ffn", "dec-ffn") else 40.0) * (1 + u[1]) for u in importance}
    full = sum(cost[u] * len(t) for u, t in importance.items())
    for fraction in (0.9, 0.5, 0.2, 0.08):
        keep = search_cost(importance, cost, fraction * full)
        assert sum(cost[u] * int(k.sum()) for u, k in keep.items()) <= fraction * full
        assert all(int(keep["dec-enc", i].sum()) >= 1 for i in range(2))
    free = search_cost(importance, cost, 0.2 * full, allow_empty_cross=True)
    assert sum(int(free["dec-enc", i].sum()) for i in range(2)) == 0
    with pytest.raises(HeadpruneError, match="too small"):
        search_cost(importance, cost, 50.0)
    heads = search_heads(importance, 5)
    assert sum(int(heads[u].sum()) for u in heads if u[0] in ("enc-self", "dec-self")) == 3
    assert all(int(heads["dec-enc", i].sum()) == 1 for i in range(2))
    assert all(bool(heads[u].all()) for u in heads if u[0].endswith("ffn"))


def test_rearrangement_keeps_the_count_and_lowers_the_loss_estimate():
    g = torch.Generator().manual_seed(1)
    grads = torch.randn(50, 8, generator=g, dtype=torch.float64)
    grads[:, 2] = grads[:, 5]  # two redundant units: pruning both costs more than one
    block = grads.t() @ grads
    mask = torch.tensor([True] * 4 + [False] * 4)
    new = rearrange(mask, block)
    assert int(new.sum()) == 4
    assert pruned_loss(block, ~new) <= pruned_loss(block, ~mask)


def test_search_steps_prune_in_nested_searches_on_the_model_pruned_so_far(
    stock_checkpoint, tiny_data, monkeypatch
):
    """--search-steps 3: three searches at geometric budgets down to the asked one, each among
    the units the previous one kept, each with the Fisher information of the model masked as
    the previous search left it (compared with fisher() called on those masks directly)."""
    model, task = load_model(stock_checkpoint, tiny_data)
    batches = calibration_batches(task, "train", 32, 16)
    _, terms = mac_terms(model, 7, 7, 5)
    masks = Masks(model)
    terms = {u: t for u, t in terms.items() if u in masks.values}
    full = sum(c * n for c, n in terms.values())
    calls = []
    real_search = search.search_cost

    def recording(importance, cost, budget, allow_empty_cross=False, among=None):
        keep = real_search(importance, cost, budget, allow_empty_cross, among)
        calls.append((importance, budget, among, keep))
        return keep

    monkeypatch.setattr(search, "search_cost", recording)
    args = Namespace(budget="macs:0.3", sites=UNIT_SITES, search_steps=3, rearrange=False,
                     allow_empty_cross_attention=False)  # fmt: skip
    keep, _ = search.choose(args, task, model, masks, batches, terms)
    assert [b for _, b, _, _ in calls] == pytest.approx([full * 0.3 ** (s / 3) for s in (1, 2, 3)])
    assert calls[0][2] is None
    for (_, _, _, before), (importance, _, among, after) in zip(calls, calls[1:]):
        assert all(torch.equal(among[u], before[u]) for u in before)
        assert all(not bool((after[u] & ~before[u]).any()) for u in before)  # nested
        expected, _ = fisher(model, masks, batches, before)
        assert all(torch.allclose(importance[u], expected[u]) for u in expected)
    assert keep == calls[-1][3]
    assert sum(terms[u][0] * int(k.sum()) for u, k in keep.items()) <= 0.3 * full
    assert step_targets(96.0, 6.0, 4) == pytest.approx([48.0, 24.0, 12.0, 6.0])
