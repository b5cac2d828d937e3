"""The head-scorer interface and the pass runner shared by every scorer.

Per-head statistics of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019) and Michel et al. 2019 ("Are
Sixteen Heads Really Better than One?", NeurIPS 2019). One interface: a scorer is called on a
``ScoringModel`` and the batches of a data split and returns, per metric name, one tensor
(layers, heads) per attention type (``enc-self``, ``dec-self``, ``dec-enc``).

Scorers that only need what one forward (+ backward of the loss) pass shows — attention maps,
head outputs, ∂L/∂gate — implement ``update(CapturedBatch)`` and ``result()`` so that several
share one pass (``run_pass``); the others (LRP, ablation) implement ``__call__`` directly.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from fairseq.models.transformer import TransformerModel
from fairseq.modules import MultiheadAttention
from torch import Tensor
from tqdm import tqdm

from fairseq_headprune.checkpoint_io import load_split
from fairseq_headprune.gated_attention import HeadGate, install_head_gate
from fairseq_headprune.pruning import parse_kept_heads, unprune_state_dict
from fairseq_headprune.sites import (
    DEC_ENC,
    DEC_SELF,
    ENC_SELF,
    SITES,
    attention_modules,
    layer_of,
    site_of,
)

SiteScores = dict[str, Tensor]  # attention type -> (layers, heads)
Scores = dict[str, SiteScores]  # metric name -> SiteScores
Key = tuple[str, int]  # (attention type, layer)


class Batches:
    """The first ``max_sentences`` sentences of a task split as fairseq samples.

    Batches hold sentences of similar length (ordered by fairseq's ``num_tokens``, then line
    number), so little of a batch is padding. Scores summed over tokens do not depend on the
    batching; Michel et al.'s importance takes |g·∂L/∂g| per batch, so it does, as in their
    method (a fixed, deterministic batching here). Re-iterable; every iteration shows a progress bar
    (``progress=True``). ``sample["id"]`` is the sentence's line number in the split.
    """

    def __init__(
        self,
        task,
        subset: str,
        max_sentences: int | None = None,
        batch_size: int = 32,
        progress: bool | None = False,
    ) -> None:
        load_split(task, subset)
        self.dataset = task.dataset(subset)
        n = len(self.dataset) if max_sentences is None else min(max_sentences, len(self.dataset))
        if n == 0:
            raise ValueError(f"subset '{subset}' is empty: nothing to score")
        self.n_sentences, self.batch_size, self.progress, self.subset = (
            n,
            batch_size,
            progress,
            subset,
        )
        self.order = sorted(range(n), key=lambda i: (self.dataset.num_tokens(i), i))

    def __len__(self) -> int:
        return -(-self.n_sentences // self.batch_size)

    def __iter__(self) -> Iterator[dict]:
        chunks = range(0, self.n_sentences, self.batch_size)
        disable = None if self.progress is None else not self.progress  # None: only on a tty
        for start in tqdm(chunks, desc=self.subset, disable=disable, leave=False):
            stop = min(start + self.batch_size, self.n_sentences)
            yield self.dataset.collater([self.dataset[i] for i in self.order[start:stop]])


@dataclass
class CapturedBatch:
    """What one forward pass shows, per (attention type, layer); batch-first masks."""

    sample: dict
    gates: SiteScores  # the gate values of this pass, (L, H) per site
    weights: dict[Key, Tensor] = field(default_factory=dict)  # (H, B, T, S) attention maps
    heads: dict[Key, Tensor] = field(default_factory=dict)  # (T, B, H, d) head outputs
    gate_grad: dict[str, Tensor] = field(default_factory=dict)  # site -> (L, H) ∂L/∂g
    query_tokens: dict[str, Tensor] = field(default_factory=dict)  # site -> (B, T)
    key_tokens: dict[str, Tensor] = field(default_factory=dict)  # site -> (B, S)
    ntokens: int = 0  # target tokens in the loss


def expand_exported(model: torch.nn.Module, task) -> tuple[torch.nn.Module, dict[Key, Tensor]]:
    """A physically pruned model rebuilt at full size, and its removed heads (gate 0).

    The kept heads go back to their original indices (``kept_heads`` of the config) and the
    removed ones get zero weights (``pruning.unprune_state_dict``), so the full-size model
    computes what the pruned one does and every head has its original (layer, head) place in
    the scores. Returns the model and, per (attention type, layer) with removed heads, a
    (H,) 0/1 vector of the heads that are there.
    """
    args = copy.copy(model.args)
    kept = parse_kept_heads(args.kept_heads)
    args.kept_heads = None
    full = task.build_model(args)
    modules, kept_by_prefix, removed = {}, {}, {}
    for prefix, attn in full.named_modules():
        if not isinstance(attn, MultiheadAttention):
            continue
        site, layer = site_of(prefix), layer_of(prefix)
        modules[prefix] = (attn.num_heads, attn.head_dim)
        if site in kept:
            heads = kept[site][layer]
            kept_by_prefix[prefix] = heads
            removed[site, layer] = torch.zeros(attn.num_heads)
            removed[site, layer][heads] = 1.0
    state = unprune_state_dict(model.state_dict(), full.state_dict(), modules, kept_by_prefix)
    full.load_state_dict(state, strict=True)
    return full, removed


class ScoringModel:
    """A fairseq transformer with a ``HeadGate`` on every attention module, gates fixed.

    Stock attention modules get a gate whose override is 1 (the model is unchanged); gated
    models keep their deterministic (evaluation) gate values, so closed heads stay closed.
    A physically pruned model (``fairseq-headprune export``) is scored at full size
    (``expand_exported``): its removed heads are there with gate 0, like closed heads.
    """

    def __init__(self, model: torch.nn.Module, task) -> None:
        if not isinstance(model, TransformerModel):
            raise ValueError(
                f"{type(model).__name__} is not a fairseq transformer: the scorer needs a "
                "'transformer' or 'gated_transformer' checkpoint"
            )
        removed: dict[Key, Tensor] = {}
        if getattr(getattr(model, "args", None), "kept_heads", None):
            model, removed = expand_exported(model, task)
        self.model, self.task = model.eval(), task
        self.attn: dict[Key, torch.nn.Module] = {}
        self.gate: dict[Key, HeadGate] = {}
        for site, layer, attn in attention_modules(model):
            gate = getattr(attn, "head_gate", None)
            if gate is None:
                gate = install_head_gate(attn)
                gate.override = removed.get((site, layer), torch.ones(attn.num_heads))
            self.attn[site, layer], self.gate[site, layer] = attn, gate
        # exported models: True where a head was removed (its attention is not there)
        self.removed: SiteScores = {
            site: torch.stack(
                [removed.get(k, torch.ones(self.attn[k].num_heads)) == 0
                 for k in sorted(self.attn) if k[0] == site]
            )
            for site in self.sites
            if any(k[0] == site for k in removed)
        }  # fmt: skip
        with torch.no_grad():
            base = {k: g.values().detach().float().clone() for k, g in self.gate.items()}
        self.base: SiteScores = {s: self._stack(base, s) for s in self.sites}
        self.set_gates(self.base)
        self.pad = task.target_dictionary.pad()
        self.eos = task.target_dictionary.eos()

    @property
    def sites(self) -> list[str]:
        return [s for s in SITES if any(k[0] == s for k in self.attn)]

    def shape(self, site: str) -> tuple[int, int]:
        layers = [k for k in self.attn if k[0] == site]
        return len(layers), self.attn[layers[0]].num_heads

    def zeros(self) -> SiteScores:
        return {s: torch.zeros(self.shape(s)) for s in self.sites}

    @staticmethod
    def _stack(per_key: dict[Key, Tensor], site: str) -> Tensor:
        return torch.stack([v for (s, _), v in sorted(per_key.items()) if s == site])

    def set_gates(self, values: SiteScores) -> None:
        """Gate overrides from one (layers, heads) tensor per site (may require grad)."""
        for (site, layer), gate in self.gate.items():
            gate.override = values[site][layer]  # (H,)

    @contextlib.contextmanager
    def gates(self, values: SiteScores) -> Iterator[None]:
        """Use ``values`` as gates inside the block, the base gates afterwards."""
        self.set_gates(values)
        try:
            yield
        finally:
            self.set_gates(self.base)

    def nll(self, sample: dict) -> tuple[Tensor, int]:
        """Summed token NLL of the reference under teacher forcing, and the token count."""
        out = self.model(**sample["net_input"])
        lprobs = self.model.get_normalized_probs(out, log_probs=True)  # (B, T, V)
        target = sample["target"]  # (B, T)
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
        mask = target.ne(self.pad)
        return nll[mask].sum(), int(mask.sum())

    def mean_loss(self, batches: Iterable[dict], values: SiteScores | None = None) -> float:
        """Mean token NLL over ``batches`` with gates ``values`` (default: base gates)."""
        total, n = 0.0, 0
        with self.gates(values if values is not None else self.base), torch.no_grad():
            for sample in batches:
                loss, ntok = self.nll(sample)
                total, n = total + float(loss), n + ntok
        return total / max(n, 1)

    @contextlib.contextmanager
    def capture(self, batch: CapturedBatch) -> Iterator[None]:
        """Record every module's (H, B, T, S) attention maps and (T, B, H, d) head outputs."""
        saved = {}
        for key, attn in self.attn.items():
            saved[key] = attn.__dict__.get("forward")
            attn.forward = functools.partial(_forward_with_head_weights, attn.forward, batch, key)
            self.gate[key].observer = functools.partial(_observe_heads, batch, key)
        try:
            yield
        finally:
            for key, attn in self.attn.items():
                if saved[key] is None:
                    del attn.forward
                else:
                    attn.forward = saved[key]
                self.gate[key].observer = None

    def tokens(self, batch: CapturedBatch) -> None:
        """Fill the query/key token ids (B, T)/(B, S) of every site for ``batch``."""
        src = batch.sample["net_input"]["src_tokens"]  # (B, S)
        prev = batch.sample["net_input"]["prev_output_tokens"]  # (B, T)
        batch.query_tokens = {ENC_SELF: src, DEC_SELF: prev, DEC_ENC: prev}
        batch.key_tokens = {ENC_SELF: src, DEC_SELF: prev, DEC_ENC: src}


def _forward_with_head_weights(forward, batch: CapturedBatch, which: Key, /, *args, **kwargs):
    """``MultiheadAttention.forward`` that also stores per-head weights; returns what the
    caller asked for (None, head-averaged or per-head weights)."""
    want = kwargs.get("need_weights", True), kwargs.get("need_head_weights", False)
    kwargs.update(need_weights=True, need_head_weights=True)
    out, weights = forward(*args, **kwargs)  # weights (H, B, T, S)
    batch.weights[which] = weights.detach()
    if want[1]:
        return out, weights
    return out, weights.mean(0) if want[0] else None


def _observe_heads(batch: CapturedBatch, key: Key, heads: Tensor, gate: Tensor) -> None:
    batch.heads[key] = heads  # (T, B, H, d), before the gate


class PassScorer:
    """A scorer fed by ``run_pass``: ``update`` per batch, then ``result``."""

    needs_grad = False  # True: the pass back-propagates the loss to the gates

    def update(self, sm: ScoringModel, batch: CapturedBatch) -> None:
        raise NotImplementedError

    def result(self) -> Scores:
        raise NotImplementedError

    def __call__(self, sm: ScoringModel, batches: Iterable[dict]) -> Scores:
        run_pass(sm, batches, [self])
        return self.result()


def run_pass(
    sm: ScoringModel,
    batches: Iterable[dict],
    scorers: list[PassScorer],
    gates: SiteScores | None = None,
) -> None:
    """One forward pass over ``batches`` (with the loss' gradient at the gates if a scorer
    needs it), feeding every scorer each batch's captured maps, head outputs and gradients.
    ``gates``: the gate values to use (default: the model's base gates)."""
    grad = any(s.needs_grad for s in scorers)
    gates = sm.base if gates is None else gates
    for sample in batches:
        batch = CapturedBatch(sample, gates=gates)
        sm.tokens(batch)
        values = {s: v.clone().requires_grad_(grad) for s, v in gates.items()}  # leaves
        with torch.set_grad_enabled(grad), sm.capture(batch), sm.gates(values):
            loss, batch.ntokens = sm.nll(sample)
            if grad:  # only the gates' gradient: no .grad on the model's parameters
                grads = torch.autograd.grad(loss, list(values.values()))
                batch.gate_grad = dict(zip(values, grads))
        with torch.no_grad():
            for scorer in scorers:
                scorer.update(sm, batch)
