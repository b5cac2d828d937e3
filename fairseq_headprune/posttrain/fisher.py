"""Calibration batches and the empirical Fisher information of the masks.

Kwon et al. 2022 ("A Fast Post-Training Pruning Framework for Transformers", §4.1–4.2)
score a mask variable m_i by the diagonal of the empirical Fisher information of the loss,
I_ii = Σ_batches (∂L/∂m_i)², and rearrange masks within a layer with that layer's block
Σ_batches g gᵀ. Here L is the teacher-forced token cross-entropy (mean over the batch's target
tokens) of the unpruned model; only the masks get gradients, never the weights.
"""

from __future__ import annotations

import logging
import random

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.sites import Unit

logger = logging.getLogger(__name__)


def calibration_batches(task, subset: str, n: int, batch_size: int, seed: int = 1) -> list[dict]:
    """``n`` sentences of ``subset`` drawn at random (``seed``), batched by length."""
    try:
        task.load_dataset(subset)
    except FileNotFoundError as e:
        raise HeadpruneError(f"--subset {subset}: no such subset in {task.cfg.data} ({e})") from e
    ds = task.dataset(subset)
    if len(ds) == 0:
        raise HeadpruneError(f"--subset {subset}: the subset in {task.cfg.data} is empty")
    if n <= 0:
        raise HeadpruneError(f"--calibration-sentences {n}: give a positive number")
    indices = list(range(len(ds)))
    random.Random(seed).shuffle(indices)
    indices = sorted(indices[:n], key=lambda i: (ds.src_sizes[i], i))
    items = [ds[i] for i in indices]
    return [ds.collater(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]


def teacher_forced_loss(model, batch: dict) -> Tensor:
    """Mean cross-entropy of the reference tokens given the reference prefix."""
    net = batch["net_input"]
    logits, _ = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    target = batch["target"]  # (B, T)
    pad = model.decoder.dictionary.pad()
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad)


def mask_gradients(model, masks: Masks, batch: dict) -> dict[Unit, Tensor]:
    """∂L/∂m of every mask for one batch (the weights get no gradient)."""
    masks.requires_grad(True)
    loss = teacher_forced_loss(model, batch)
    loss.backward()
    grads = masks.grads()
    masks.requires_grad(False)
    return grads


def fisher(
    model, masks: Masks, batches: list[dict], at: dict[Unit, Tensor] | None = None
) -> tuple[dict, dict]:
    """(diagonal {unit: (n,)}, blocks {unit: (n, n)}) of the empirical Fisher over ``batches``.

    The masks are set to ``at`` (the model pruned so far), by default every mask 1; the
    model's parameters are frozen for the duration.
    """
    masks.set(masks.ones())
    if at is not None:
        masks.set({u: m.float() for u, m in at.items()})
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    diag = {u: torch.zeros_like(v, dtype=torch.float64) for u, v in masks.values.items()}
    blocks = {u: torch.zeros(len(v), len(v), dtype=torch.float64) for u, v in diag.items()}
    model.eval()
    try:
        for batch in batches:
            for unit, g in mask_gradients(model, masks, batch).items():
                g = g.double()
                diag[unit] += g * g
                blocks[unit] += torch.outer(g, g)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    logger.info(f"Fisher information of {len(diag)} mask groups from {len(batches)} batches")
    return diag, blocks
