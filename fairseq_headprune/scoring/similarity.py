"""Pairwise similarity of the heads of one attention layer: cosine and linear CKA.

A redundancy statistic in the spirit of Michel et al. 2019 ("Are Sixteen Heads Really Better
than One?"), with linear centered kernel alignment from Kornblith et al. 2019 ("Similarity of
Neural Network Representations Revisited", ICML 2019):

- **cosine**: the mean over non-padding query tokens of cos(c_i, c_j), where c_h =
  W_O[:, h] · head_h is head h's contribution to the attention output (the heads' own d-dim
  outputs live in unrelated value spaces, their contributions in the same model space);
- **CKA**: linear CKA between the heads' (tokens × d) output matrices X_i, X_j,
  ‖X_jᵀ X_i‖²_F / (‖X_iᵀ X_i‖_F ‖X_jᵀ X_j‖_F) after centering over tokens — invariant to
  orthogonal transforms and scaling of each head's value space. Accumulated exactly from the
  uncentered second moments Σ z zᵀ and Σ z of the concatenated heads z (H·d).

Both are (H, H) per layer, stored as (layers, H, H) per attention type; gates are ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fairseq_headprune.scoring.base import CapturedBatch, PassScorer, Scores, ScoringModel


def linear_cka_matrix(moment: Tensor, total: Tensor, n: int, num_heads: int) -> Tensor:
    """(H·d, H·d) Σ z zᵀ, (H·d,) Σ z over n tokens → (H, H) linear CKA between heads."""
    cov = moment - torch.outer(total, total) / n  # (H·d, H·d) centered cross-products
    d = cov.shape[0] // num_heads
    blocks = cov.reshape(num_heads, d, num_heads, d).permute(0, 2, 1, 3)  # (H, H, d, d)
    cross = blocks.pow(2).sum((-1, -2))  # (H, H) ‖X_jᵀ X_i‖²_F
    self_norm = cross.diagonal().sqrt()  # (H,) ‖X_iᵀ X_i‖_F
    return cross / torch.outer(self_norm, self_norm).clamp_min(1e-20)


class HeadSimilarity(PassScorer):
    """Per layer, (H, H) cosine similarity of head contributions and linear CKA of outputs."""

    def __init__(self) -> None:
        self.cos: dict[tuple[str, int], Tensor] = {}
        self.moment: dict[tuple[str, int], Tensor] = {}
        self.total: dict[tuple[str, int], Tensor] = {}
        self.n: dict[tuple[str, int], int] = {}

    def update(self, sm: ScoringModel, batch: CapturedBatch) -> None:
        for key, heads in batch.heads.items():
            site = key[0]
            mask = batch.query_tokens[site].ne(sm.pad).T  # (T, B)
            x = heads.detach().double()[mask]  # (N, H, d)
            n, num_heads, d = x.shape
            w = sm.attn[key].out_proj.weight.detach().double()  # (E, H·d)
            w = w.reshape(-1, num_heads, d)  # (E, H, d)
            contrib = torch.einsum("nhd,ehd->nhe", x, w)  # (N, H, E)
            unit = contrib / contrib.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            z = x.reshape(n, num_heads * d)  # (N, H·d)
            self.cos[key] = self.cos.get(key, 0) + torch.einsum("nhe,nge->hg", unit, unit)
            self.moment[key] = self.moment.get(key, 0) + z.T @ z
            self.total[key] = self.total.get(key, 0) + z.sum(0)
            self.n[key] = self.n.get(key, 0) + n

    def result(self) -> Scores:
        cos, cka = {}, {}
        for key in sorted(self.n):
            num_heads = self.cos[key].shape[0]
            cos[key] = (self.cos[key] / max(self.n[key], 1)).float()
            cka[key] = linear_cka_matrix(
                self.moment[key], self.total[key], max(self.n[key], 1), num_heads
            ).float()
        sites = dict.fromkeys(s for s, _ in self.n)
        return {
            "similarity_cosine": {s: ScoringModel._stack(cos, s) for s in sites},
            "similarity_cka": {s: ScoringModel._stack(cka, s) for s in sites},
        }
