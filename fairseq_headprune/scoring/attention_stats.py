"""Attention-map statistics per head: confidence, entropy, positional and rare-word roles.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy
Lifting, the Rest Can Be Pruned", ACL 2019), sections 4 and 5:

- **confidence**: the mean, over query tokens, of the head's maximum attention weight;
- **entropy**: the mean attention entropy (nats), one of Michel et al.'s 2019 statistics;
- **positional**: the distribution of the relative offset (key position − query position) of
  the most-attended token; a head is positional for offset k when ≥ 90 % of its maxima fall
  on k (threshold chosen by the caller). Only for self-attention (``enc-self``,
  ``dec-self``): encoder-decoder offsets compare positions of different sentences;
- **rare-word**: how often the most-attended token is the least frequent token of the key
  sentence (frequencies: the fairseq dictionary's counts, i.e. the training data; special
  symbols excluded; ties go to the first such token). In ``dec-self`` only queries that can
  see the rare token (at or after it) count.

Query tokens that are padding or EOS are excluded from every statistic (the EOS that starts
``prev_output_tokens`` included). Offsets beyond ±``MAX_OFFSET`` are clipped.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fairseq_headprune.scoring.base import CapturedBatch, PassScorer, Scores, ScoringModel
from fairseq_headprune.sites import DEC_ENC, DEC_SELF, ENC_SELF

MAX_OFFSET = 128
SELF_SITES = (ENC_SELF, DEC_SELF)


def least_frequent_position(tokens: Tensor, counts: Tensor, nspecial: int) -> Tensor:
    """(B, S) token ids → (B,) position of the least frequent non-special token."""
    freq = counts[tokens].float()  # (B, S)
    freq = freq.masked_fill(tokens < nspecial, math.inf)
    return freq.argmin(dim=-1)  # (B,) first minimum


class AttentionStats(PassScorer):
    """Confidence, entropy, positional offsets and rare-word hits of every head."""

    def __init__(
        self,
        shapes: dict[str, tuple[int, int]],
        pad: int,
        eos: int,
        counts: dict[str, Tensor],
        nspecial: int,
    ) -> None:
        """``counts``: per site, the token counts (V,) of the dictionary of its keys."""
        self.pad, self.eos, self.counts, self.nspecial = pad, eos, counts, nspecial
        self.n = {s: torch.zeros(shape) for s, shape in shapes.items()}
        self.conf = {s: torch.zeros(shape) for s, shape in shapes.items()}
        self.ent = {s: torch.zeros(shape) for s, shape in shapes.items()}
        self.hist = {
            s: torch.zeros(*shape, 2 * MAX_OFFSET + 1) for s, shape in shapes.items()
        }  # (L, H, offsets)
        self.rare_hits = {s: torch.zeros(shape) for s, shape in shapes.items()}
        self.rare_n = {s: torch.zeros(shape) for s, shape in shapes.items()}

    @classmethod
    def for_model(cls, sm: ScoringModel) -> AttentionStats:
        src, tgt = sm.task.source_dictionary, sm.task.target_dictionary
        counts = {
            ENC_SELF: torch.tensor(src.count),
            DEC_ENC: torch.tensor(src.count),
            DEC_SELF: torch.tensor(tgt.count),
        }
        shapes = {s: sm.shape(s) for s in sm.sites}
        return cls(shapes, sm.pad, sm.eos, counts, src.nspecial)

    def update(self, sm: ScoringModel | None, batch: CapturedBatch) -> None:
        for (site, layer), w in batch.weights.items():
            self.add(site, layer, w.float(), batch.query_tokens[site], batch.key_tokens[site])

    def add(self, site: str, layer: int, w: Tensor, qtok: Tensor, ktok: Tensor) -> None:
        """Accumulate one module's maps ``w`` (H, B, T, S) for queries (B, T), keys (B, S)."""
        qmask = qtok.ne(self.pad) & qtok.ne(self.eos)  # (B, T)
        top, arg = w.max(dim=-1)  # (H, B, T)
        entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (H, B, T)
        self.n[site][layer] += qmask.sum()
        self.conf[site][layer] += top[:, qmask].sum(-1)
        self.ent[site][layer] += entropy[:, qmask].sum(-1)
        pos = torch.arange(qtok.shape[1])  # (T,)
        if site in SELF_SITES:
            offset = (arg - pos[None, None, :]).clamp(-MAX_OFFSET, MAX_OFFSET)  # (H, B, T)
            onehot = torch.nn.functional.one_hot(offset[:, qmask] + MAX_OFFSET, 2 * MAX_OFFSET + 1)
            self.hist[site][layer] += onehot.sum(1).float()  # (H, offsets)
        rare = least_frequent_position(ktok, self.counts[site], self.nspecial)  # (B,)
        seen = qmask
        if site == DEC_SELF:  # causal: queries before the rare token cannot attend to it
            seen = qmask & (pos[None, :] >= rare[:, None])  # (B, T)
        hits = arg.eq(rare[None, :, None])  # (H, B, T)
        self.rare_hits[site][layer] += hits[:, seen].sum(-1).float()
        self.rare_n[site][layer] += seen.sum()

    def result(self) -> Scores:
        out: Scores = {
            "confidence": {},
            "entropy": {},
            "positional_offset": {},
            "positional_fraction": {},
            "rare_word": {},
        }
        for site, n in self.n.items():
            n = n.clamp_min(1)
            out["confidence"][site] = self.conf[site] / n
            out["entropy"][site] = self.ent[site] / n
            hist = self.hist[site]  # (L, H, offsets)
            frac, idx = (hist / hist.sum(-1, keepdim=True).clamp_min(1)).max(-1)  # (L, H)
            nan = torch.full_like(frac, math.nan)
            self_attn = site in SELF_SITES
            out["positional_offset"][site] = (idx - MAX_OFFSET).float() if self_attn else nan
            out["positional_fraction"][site] = frac if self_attn else nan
            out["rare_word"][site] = self.rare_hits[site] / self.rare_n[site].clamp_min(1)
        return out
