"""Read and write fairseq checkpoints for the ``fairseq-headprune`` tools.

Part of the tooling around Voita et al. 2019 ("Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"): gates are inspected and
pruned models written without rebuilding a fairseq task.
"""

from __future__ import annotations

import copy
import os
import tempfile
from argparse import Namespace
from pathlib import Path

import torch

from fairseq_headprune.checkpoint_safety import allow_fairseq_checkpoints
from fairseq_headprune.gated_transformer import gate_defaults
from fairseq_headprune.hard_concrete import HardConcreteGate

GATE_SUFFIX = ".head_gate.theta"


def load_checkpoint(path: str | os.PathLike) -> dict:
    """``torch.load`` a fairseq checkpoint with safe loading (the fairseq classes allowed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    allow_fairseq_checkpoints()
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path} is not a fairseq checkpoint (no 'model' state)")
    return state


def model_args(state: dict) -> Namespace:
    """The model's saved configuration as a Namespace (argparse-era and dataclass configs)."""
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if model is None:
        model = state.get("args")
    if model is None:
        raise ValueError("the checkpoint holds no model configuration")
    return model if isinstance(model, Namespace) else Namespace(**dict(model))


def gates_from_state(state: dict) -> dict[str, HardConcreteGate]:
    """Attention prefix (``encoder.layers.0.self_attn``) → its gate, rebuilt from a checkpoint."""
    args = copy.copy(model_args(state))
    gate_defaults(args)
    gates = {}
    for key, theta in state["model"].items():
        if key.endswith(GATE_SUFFIX):
            gate = HardConcreteGate(
                theta.numel(),
                temperature=args.head_gate_temperature,
                stretch=(args.head_gate_stretch_low, args.head_gate_stretch_high),
                lr_scale=args.head_gate_lr_scale,
            )
            gate.theta.data.copy_(theta)
            gates[key[: -len(GATE_SUFFIX)]] = gate.eval()
    return gates


def atomic_save(state: dict, path: str | os.PathLike, force: bool = False) -> None:
    """Write ``state`` to ``path`` through a temporary file: never a half-written checkpoint."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
