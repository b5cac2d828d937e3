"""Head importance by gradient, output norm and ablation.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?", NeurIPS 2019):

- **importance** I_h = |ξ_h · ∂L/∂ξ_h| = |⟨head output, ∂L/∂head output⟩|, with ξ_h the gate
  at the ``out_proj`` seam (the ``HeadGate`` override, a leaf tensor) and L the summed token
  NLL of a batch under teacher forcing. Absolute values are taken per batch and summed,
  divided by the number of target tokens (``importance_raw``); ``importance`` is that
  normalised per layer by its L2 norm (Michel et al.'s ``--normalize_pruning_by_layer``);
- **output_norm**: the mean L2 norm of the gated head output g_h·head_h over query tokens;
- **single-head ablation**: Δ mean validation NLL when that head's gate is set to 0 (each
  batch's computation before the head's layer is done once and replayed for the heads that
  cannot change it);
- **iterative pruning** (Michel et al.'s §4, :func:`iterative_pruning`): repeatedly recompute
  the importance under the current mask, remove the ``step`` least important remaining heads
  (ranked by per-layer-normalised importance) and re-evaluate. The **greedy ablation curve**
  ranks all attention types together down to no head; ``recipes.study.controls michel``
  ranks each budgeted type apart down to its budget.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from fairseq_headprune.scoring.base import (
    CapturedBatch,
    PassScorer,
    Scores,
    ScoringModel,
    SiteScores,
    run_pass,
)
from fairseq_headprune.sites import ENC_SELF


def normalize_per_layer(scores: SiteScores, eps: float = 1e-20) -> SiteScores:
    """Divide each layer's row of scores by its L2 norm."""
    return {s: v / v.norm(dim=-1, keepdim=True).clamp_min(eps) for s, v in scores.items()}


class GradientImportance(PassScorer):
    """|g · ∂L/∂g| per head, accumulated over batches (Michel et al. 2019)."""

    needs_grad = True

    def __init__(self) -> None:
        self.total: SiteScores = {}
        self.ntokens = 0

    def update(self, sm: ScoringModel, batch: CapturedBatch) -> None:
        for site, grad in batch.gate_grad.items():
            contrib = (batch.gates[site] * grad).abs()  # (L, H)
            self.total[site] = self.total.get(site, 0) + contrib
        self.ntokens += batch.ntokens

    def result(self) -> Scores:
        raw = {s: v / max(self.ntokens, 1) for s, v in self.total.items()}
        return {"importance_raw": raw, "importance": normalize_per_layer(raw)}


class OutputNorm(PassScorer):
    """Mean L2 norm of each gated head output g_h·head_h over non-padding query tokens."""

    def __init__(self) -> None:
        self.total: dict[tuple[str, int], torch.Tensor] = {}
        self.count: dict[tuple[str, int], int] = {}

    def update(self, sm: ScoringModel, batch: CapturedBatch) -> None:
        for (site, layer), heads in batch.heads.items():
            mask = batch.query_tokens[site].ne(sm.pad).T  # (T, B)
            gate = batch.gates[site][layer].detach()  # (H,)
            norms = heads.detach()[mask].norm(dim=-1) * gate.abs()  # (N, H)
            key = site, layer
            self.total[key] = self.total.get(key, 0) + norms.sum(0)
            self.count[key] = self.count.get(key, 0) + norms.shape[0]

    def result(self) -> Scores:
        per_key = {k: v / max(self.count[k], 1) for k, v in self.total.items()}
        sites = dict.fromkeys(s for s, _ in per_key)
        return {"output_norm": {s: ScoringModel._stack(per_key, s) for s in sites}}


def single_head_ablation(sm: ScoringModel, batches: Iterable[dict]) -> tuple[float, SiteScores]:
    """Base mean NLL and, per head, Δ mean NLL when only that head's gate is 0.

    Exact, with less work than one full teacher-forced pass per head: batches are the outer
    loop, heads the inner one. Each batch is run once with the base gates, recording the
    output of the encoder and of every encoder and decoder layer; an ablated head cannot change
    anything computed before its gate, so its pass replays those outputs instead of computing
    them again:

    - ``enc-self`` head in encoder layer l: encoder layers 0..l−1 are replayed;
    - ``dec-self`` / ``dec-enc`` head in decoder layer l: the whole encoder and decoder layers
      0..l−1 are replayed.

    What is computed runs the same operations on the same tensors as a full pass, so every
    Δ is the same number as that of a full pass with the head's gate set to 0 (tested for
    equality). Heads whose base gate is already 0 have Δ = 0 without a pass. Memory: the
    recorded outputs of one batch.
    """
    heads = [
        (site, layer, head)
        for site in sm.sites
        for layer, head in itertools.product(*map(range, sm.shape(site)))
        if float(sm.base[site][layer, head]) != 0.0
    ]
    model = sm.model
    enc_layers, dec_layers = list(model.encoder.layers), list(model.decoder.layers)
    recorded_modules = [model.encoder, *enc_layers[:-1], *dec_layers[:-1]]
    base_total, totals, ntokens = 0.0, dict.fromkeys(heads, 0.0), 0
    with torch.no_grad():
        for sample in batches:
            outputs: dict[torch.nn.Module, Any] = {}
            with _patched_forward(recorded_modules, _record, outputs), sm.gates(sm.base):
                loss, ntok = sm.nll(sample)
            base_total, ntokens = base_total + float(loss), ntokens + ntok
            for site, layer, head in heads:
                if site == ENC_SELF:
                    replayed = enc_layers[:layer]
                else:
                    replayed = [model.encoder, *dec_layers[:layer]]
                values = {s: v.clone() for s, v in sm.base.items()}
                values[site][layer, head] = 0.0
                with _patched_forward(replayed, _replay, outputs), sm.gates(values):
                    loss, _ = sm.nll(sample)
                totals[site, layer, head] += float(loss)
    base_loss = base_total / max(ntokens, 1)
    delta = sm.zeros()
    for (site, layer, head), total in totals.items():
        delta[site][layer, head] = total / max(ntokens, 1) - base_loss
    return base_loss, delta


def full_pass_ablation(sm: ScoringModel, batches: Iterable[dict]) -> tuple[float, SiteScores]:
    """The reference for :func:`single_head_ablation`: one full teacher-forced pass over all
    ``batches`` per head, that head's gate set to 0 (slow; for tests and the benchmark)."""
    base = sm.mean_loss(batches)
    delta = sm.zeros()
    for site in sm.sites:
        for layer, head in itertools.product(*map(range, sm.shape(site))):
            values = {s: v.clone() for s, v in sm.base.items()}
            values[site][layer, head] = 0.0
            delta[site][layer, head] = sm.mean_loss(batches, values) - base
    return base, delta


def _record(forward, outputs: dict, module: torch.nn.Module, /, *args, **kwargs):
    """``module.forward`` that also stores its output in ``outputs[module]``."""
    outputs[module] = forward(*args, **kwargs)
    return outputs[module]


def _replay(forward, outputs: dict, module: torch.nn.Module, /, *args, **kwargs):
    """``module.forward`` that returns the recorded output without computing anything."""
    return outputs[module]


@contextlib.contextmanager
def _patched_forward(
    modules: Iterable[torch.nn.Module], wrapper: Callable, outputs: dict
) -> Iterator[None]:
    """Inside the block, ``module(...)`` calls ``wrapper(original forward, outputs, module,
    ...)`` for each of ``modules``; their own ``forward`` afterwards."""
    modules = list(modules)
    saved = [m.__dict__.get("forward") for m in modules]
    for m in modules:
        m.forward = functools.partial(wrapper, m.forward, outputs, m)
    try:
        yield
    finally:
        for m, forward in zip(modules, saved):
            if forward is None:
                del m.forward
            else:
                m.forward = forward


# (attention type, layer, head)
Head = tuple[str, int, int]


def iterative_pruning(
    sm: ScoringModel,
    batches: Iterable[dict],
    groups: Sequence[tuple[list[Head], int, int]],
    on_step: Callable[[dict], None] | None = None,
) -> tuple[SiteScores, list[dict]]:
    """Michel et al.'s iterative pruning (§4): the gates left, and rows {removed, loss}.

    ``groups``: (heads, step, keep) — heads ranked together, how many are removed per step
    and how many are kept in the end. Each step recomputes the per-layer-normalised
    importance under the current gates and removes, in every group, the ``step`` least
    important remaining heads (fewer if ``keep`` would be passed), until every group is down
    to ``keep``. Row 0 is the starting loss; row i lists the heads removed at step i and the
    mean NLL after it (also passed to ``on_step``). No retraining between steps.
    """
    values = {s: v.clone() for s, v in sm.base.items()}
    alive = [list(heads) for heads, _, _ in groups]
    rows = [{"removed": [], "loss": sm.mean_loss(batches, values)}]
    while any(len(heads) > keep for heads, (_, _, keep) in zip(alive, groups)):
        scorer = GradientImportance()
        run_pass(sm, batches, [scorer], gates=values)
        importance = scorer.result()["importance"]
        removed = []
        for g, (_, step, keep) in enumerate(groups):
            n = min(step, len(alive[g]) - keep)
            if n <= 0:
                continue
            alive[g].sort(key=lambda k: float(importance[k[0]][k[1], k[2]]))
            for site, layer, head in alive[g][:n]:
                values[site][layer, head] = 0.0
            removed += alive[g][:n]
            alive[g] = alive[g][n:]
        rows.append({"removed": removed, "loss": sm.mean_loss(batches, values)})
        if on_step is not None:
            on_step(rows[-1])
    return values, rows


def open_heads(gates: SiteScores, sites: Iterable[str] | None = None) -> list[Head]:
    """The heads whose gate is > 0, of ``sites`` (default: all), in type, layer, head order."""
    names = gates if sites is None else sites
    return [(s, i, h) for s in names for i, h in (gates[s] > 0).nonzero().tolist()]


def ablation_curve(sm: ScoringModel, batches: Iterable[dict], step: int = 0) -> list[dict]:
    """Greedy pruning curve: rows {removed, loss, heads: [[site, layer, head], ...]}.

    :func:`iterative_pruning` of all attention types ranked together, down to no head;
    ``step`` heads are removed at a time (0: about 10 % of the heads); heads already closed
    in the model are never counted as removed.
    """
    alive = open_heads(sm.base)
    step = step or max(1, round(len(alive) / 10))
    _, steps = iterative_pruning(sm, batches, [(alive, step, 0)])
    rows, removed = [], 0
    for row in steps:
        removed += len(row["removed"])
        rows.append(
            {"removed": removed, "loss": row["loss"], "heads": [list(k) for k in row["removed"]]}
        )
    return rows
