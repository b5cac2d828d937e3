"""A latency model measured on this machine, for ``--budget latency:F``.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", §4.1) search
under a latency constraint with a table of measured latencies per layer, which they find
linear in the number of heads and neurons above a small threshold. Here fairseq's own beam
search (what ``fairseq-generate`` runs: ``beam`` hypotheses of each of a batch of calibration
sentences, forced to the calibration sentences' mean target length so that every model does
the same steps) is timed, round by round, for

- the full model;
- the floor: a copy with every head and neuron removed (embeddings, output layer, layer
  norms and the beam search's own work are left), the time no pruning of heads and neurons
  removes;
- for each kind of unit (``enc-self``, ``dec-self``, ``dec-enc`` heads, ``enc-ffn``,
  ``dec-ffn`` neurons), a copy with that kind removed from every layer.

What removing a kind saves, over its units, is its seconds per unit. The kinds' savings are
scaled to add up to exactly the full model's time minus the floor (they overlap a little, and
timing is noisy), so a model with no units is predicted at the floor and the full model at its
own time. Time it on an otherwise idle machine: other load makes the differences noise.
"""

from __future__ import annotations

import copy
import warnings
from argparse import Namespace
from collections.abc import Callable, Iterable

from torch import nn

from fairseq_headprune.bench import best_of
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.posttrain.fisher import calibration_batches
from fairseq_headprune.pruning import resize_attention, resize_ffn
from fairseq_headprune.sites import (
    UNIT_SITES,
    Unit,
    attention_modules,
    ffn_layers,
    set_attention,
    site_layers,
)


def forced_search(task, model: nn.Module, beam: int, steps: int) -> Callable[[dict], list]:
    """A function running fairseq's beam search (what ``fairseq-generate`` runs) on a batch
    with every hypothesis forced to ``steps`` tokens, so that every model does the same steps."""
    opts = Namespace(beam=beam, min_len=steps, max_len_a=0, max_len_b=steps)
    gen = task.build_generator([model], opts)
    return lambda batch: task.inference_step(gen, [model], batch)


def without(model: nn.Module, kinds: Iterable[str]) -> nn.Module:
    """A copy of ``model`` with every head or neuron of ``kinds`` removed from every layer."""
    kinds = set(kinds)
    model = copy.deepcopy(model)
    with warnings.catch_warnings():  # zero-width layers initialise no weights
        warnings.simplefilter("ignore", UserWarning)
        for site, _, layer in list(ffn_layers(model)):
            if site in kinds:
                resize_ffn(layer, 0)
        for site, i, attn in list(attention_modules(model)):
            if site in kinds and attn.num_heads:
                set_attention(site_layers(model, site)[i], site, resize_attention(attn, 0))
    return model


def unit_counts(model: nn.Module) -> dict[Unit, int]:
    """Heads of every attention layer and neurons of every FFN of ``model``."""
    counts = {(site, i): attn.num_heads for site, i, attn in attention_modules(model)}
    counts.update({(site, i): layer.fc1.out_features for site, i, layer in ffn_layers(model)})
    return counts


def latency_terms(
    task, model: nn.Module, batch: dict, beam: int, steps: int, repeats: int = 10
) -> tuple[float, float, dict[Unit, tuple[float, int]]]:
    """(full model's seconds, the floor's seconds, {unit: (seconds per head/neuron, count)})."""
    counts = unit_counts(model)
    units = {k: sum(n for (site, _), n in counts.items() if site == k) for k in UNIT_SITES}
    kinds = [k for k in UNIT_SITES if units[k]]
    variants = {"full": model, "floor": without(model, kinds)}
    variants.update({k: without(model, [k]) for k in kinds})
    runs = {n: forced_search(task, m, beam, steps) for n, m in variants.items()}
    t = best_of(runs, [batch], repeats)  # interleaved rounds, the best of each
    full = t["full"]
    saved = {k: max(full - t[k], 0.0) for k in kinds}
    # what the kinds together explain: the full model's time above the floor, unless timing
    # noise says removing them saves nothing (then nothing is prunable time)
    explained = max(full - t["floor"], 0.0) if sum(saved.values()) > 0 else 0.0
    scale = explained / sum(saved.values()) if explained else 0.0
    per_unit = {k: saved.get(k, 0.0) * scale / max(units[k], 1) for k in UNIT_SITES}
    terms = {(site, i): (per_unit[site], n) for (site, i), n in counts.items()}
    return full, full - explained, terms


def latency_budget(args, task, model: nn.Module, budget: float, tgt_len: int) -> tuple:
    """(seconds per unit, seconds the kept units may take, report) for ``--budget latency:F``,
    timed on one batch of ``--latency-batch-size`` calibration sentences; a budget below the
    floor is refused."""
    batch = calibration_batches(
        task, args.subset, args.latency_batch_size, args.latency_batch_size, args.seed
    )[0]
    full, floor, terms = latency_terms(task, model, batch, args.beam, tgt_len)
    allowed = budget * full - floor
    if allowed < 0:
        raise HeadpruneError(
            f"--budget latency:{budget}: no mask can meet it: {floor / full:.0%} of the "
            f"measured {full:.3f} s (embeddings, output layer, beam search) is not prunable"
        )
    by_kind: dict[str, float] = {}
    for (site, _), (c, n) in terms.items():
        by_kind[site] = by_kind.get(site, 0.0) + c * n
    report = {"seconds_full": full, "seconds_unprunable": floor, "seconds_by_kind": by_kind}
    return {u: c for u, (c, _) in terms.items()}, allowed, report


def predicted_seconds(floor: float, cost: dict[Unit, float], keep: dict) -> float:
    """The latency model's time for keeping ``keep[unit]`` (a boolean mask) of every unit."""
    return floor + sum(cost[u] * int(k.sum()) for u, k in keep.items())
