"""Helpers of the export tests (test_export, test_export_gates): the gated checkpoint's
gates, ``fairseq-headprune export`` and a model's logits."""

import copy
from pathlib import Path

import torch

from tests.helpers import cli, load_state

# log α per head (saved without --head-gate-lr-scale: θ = log α) → deterministic gate 0,
# ≈0.53, ≈0.78, 1 (σ(a)·1.2 − 0.1, clipped): decided (0, or kept at ≥ OPEN_GATE = 0.5)
THETAS = {
    "enc-self": [[-6.0, 0.1, 1.0, 6.0], [-6.0, -6.0, -6.0, -6.0]],  # layer 1: all closed
    "dec-self": [[6.0, -6.0, 0.5, 6.0], [6.0, 6.0, 6.0, 6.0]],
    "dec-enc": [[-6.0, 6.0, -6.0, 0.2], [6.0, -6.0, 6.0, 6.0]],
}
PREFIX = {"enc-self": "encoder.layers.{}.self_attn", "dec-self": "decoder.layers.{}.self_attn"}
PREFIX["dec-enc"] = "decoder.layers.{}.encoder_attn"


def write_gated(stock_checkpoint: Path, path: Path, thetas: dict = THETAS) -> Path:
    """The stock model as a gated_transformer whose gates have ``thetas`` (a row of θ per layer
    of each attention type), saved to ``path``."""
    state = load_state(stock_checkpoint)
    args = copy.copy(state["cfg"]["model"])
    args.arch = args._name = "gated_transformer"
    state["cfg"]["model"] = args
    for site, rows in thetas.items():
        for i, row in enumerate(rows):
            state["model"][PREFIX[site].format(i) + ".head_gate.theta"] = torch.tensor(row)
    torch.save(state, path)
    return path


def export(*args):
    return cli("fairseq-headprune", "export", *args, check=False)


def logits(model, src, prev):
    with torch.no_grad():
        return model(src, torch.full((src.shape[0],), src.shape[1]), prev)[0]
