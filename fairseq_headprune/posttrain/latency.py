"""A latency model measured on this machine, for ``--budget latency:F``.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", §4.1) search
under a latency constraint with a table of measured latencies per layer, which they find
linear in the number of heads and neurons above a small threshold. Here the latency of
beam-search-shaped decoding (``bench.decode_steps``: the encoder, then the calibration
sentences' mean number of incremental decoder steps for ``beam`` hypotheses of each of
``batch`` sentences) is measured for the full model and for copies in which one kind of unit
(``enc-self``, ``dec-self``, ``dec-enc`` heads, ``enc-ffn``, ``dec-ffn`` neurons) is halved in
every layer; the differences give seconds per unit of each kind (at least 0; scaled down if
timing noise makes them explain more than the whole), and what no unit explains (embeddings,
output layer, layer norms, beam bookkeeping) is the constant. Time it on an otherwise idle
machine: other load makes the differences noise.
"""

from __future__ import annotations

import copy
import time

from torch import nn

from fairseq_headprune.bench import decode_steps
from fairseq_headprune.pruning import resize_attention, resize_ffn
from fairseq_headprune.sites import (
    FFN_SITES,
    UNIT_SITES,
    Unit,
    attention_modules,
    ffn_layers,
    set_attention,
    site_layers,
)


def timed(model: nn.Module, batch: dict, beam: int, steps: int, repeats: int) -> float:
    """Best wall time of :func:`bench.decode_steps` over ``repeats`` runs (after a warm-up)."""
    decode_steps(model, batch, beam, 1)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode_steps(model, batch, beam, steps)
        best = min(best, time.perf_counter() - t0)
    return best


def halved(model: nn.Module, kind: str) -> tuple[nn.Module, int]:
    """A copy of ``model`` whose units of ``kind`` are halved in every layer (fresh weights),
    and how many units that removed."""
    model = copy.deepcopy(model)
    removed = 0
    if kind in FFN_SITES:
        for site, _, layer in ffn_layers(model):
            if site == kind:
                width = layer.fc1.out_features
                resize_ffn(layer, width // 2)
                removed += width - width // 2
        return model, removed
    for site, i, attn in attention_modules(model):
        if site == kind and attn.num_heads:
            kept = attn.num_heads // 2
            removed += attn.num_heads - kept
            set_attention(site_layers(model, site)[i], site, resize_attention(attn, kept))
    return model, removed


def latency_terms(
    model: nn.Module, batch: dict, beam: int, steps: int, repeats: int = 3
) -> tuple[float, float, dict[Unit, tuple[float, int]]]:
    """(full model's seconds, unexplained seconds, {unit: (seconds per head/neuron, count)})."""
    full = timed(model, batch, beam, steps, repeats)
    per_unit = {}
    for kind in UNIT_SITES:
        smaller, removed = halved(model, kind)
        saved = full - timed(smaller, batch, beam, steps, repeats)
        per_unit[kind] = max(saved, 0.0) / max(removed, 1)
    terms: dict[Unit, tuple[float, int]] = {}
    for site, i, attn in attention_modules(model):
        terms[site, i] = (per_unit[site], attn.num_heads)
    for site, i, layer in ffn_layers(model):
        terms[site, i] = (per_unit[site], layer.fc1.out_features)
    explained = sum(c * n for c, n in terms.values())
    if explained > full:  # timing noise: the units cannot take longer than the whole
        terms = {u: (c * full / explained, n) for u, (c, n) in terms.items()}
        explained = full
    return full, full - explained, terms
