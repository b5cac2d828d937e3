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

from fairseq_headprune.checkpoint_safety import allow_fairseq_checkpoints, load_error
from fairseq_headprune.errors import HeadpruneError, user_error
from fairseq_headprune.gate_flags import gate_defaults
from fairseq_headprune.hard_concrete import HardConcreteGate
from fairseq_headprune.sites import DEC_ENC, DEC_SELF, ENC_SELF, GATE_SUFFIX


def load_checkpoint(path: str | os.PathLike) -> dict:
    """``torch.load`` a fairseq checkpoint with safe loading (the fairseq classes allowed).

    Every subcommand loads through here: a missing, empty, truncated or foreign file, and one
    holding a class that is not allow-listed, is a one-line :class:`HeadpruneError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    allow_fairseq_checkpoints()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, MemoryError):
        raise
    except Exception as e:
        raise load_error(e, path) from e
    if not isinstance(state, dict) or "model" not in state:
        raise HeadpruneError(f"{path} is not a fairseq checkpoint (no 'model' state)")
    return state


def load_model_and_task(path: str | os.PathLike, data: str):
    """A checkpoint's model (eval mode) and task through fairseq's loader, data dir overridden.

    Errors as :func:`load_checkpoint`: one line for a missing or unreadable file, and the
    plugin's own diagnosis when the model does not fit the checkpoint.
    """
    from fairseq import checkpoint_utils

    if not Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    allow_fairseq_checkpoints()
    try:
        (model, *_), _, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides={"data": data}
        )
    except Exception as e:  # fairseq and torch raise many types for a bad file
        err = user_error(e)
        if err is None:
            err = HeadpruneError(f"cannot load {path} as a fairseq checkpoint: {e}")
        raise err from e
    return model.eval(), task


def load_split(task, subset: str) -> None:
    """``task.load_dataset(subset)``; an empty or unreadable split is a one-line error."""
    data = str(getattr(task.cfg, "data", "DATA"))
    folder = Path(data.split(os.pathsep)[0])
    # fairseq cannot memory-map an empty file (and its half-built dataset then complains)
    empty = sorted(
        str(f) for f in folder.glob(f"{subset}.*") if f.is_file() and not f.stat().st_size
    )
    if empty:
        raise HeadpruneError(f"split {subset!r} of {data} is empty (empty file {', '.join(empty)})")
    try:
        task.load_dataset(subset)
    except FileNotFoundError as e:
        raise HeadpruneError(f"no split {subset!r} in {data}: {e}") from e
    if len(task.dataset(subset)) == 0:
        raise HeadpruneError(f"split {subset!r} of {data} is empty: nothing to read")


def model_args(state: dict) -> Namespace:
    """The model's saved configuration as a Namespace (argparse-era and dataclass configs)."""
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if model is None:
        model = state.get("args")
    if model is None:
        raise ValueError("the checkpoint holds no model configuration")
    return model if isinstance(model, Namespace) else Namespace(**dict(model))


def head_layout(state: dict) -> dict[str, tuple[int, int]]:
    """Attention type → (layers, heads per layer) of the full model a checkpoint was cut from.

    Read from the saved configuration; the heads a pruned checkpoint kept are its
    ``kept_heads`` (``pruning.parse_kept_heads``), gated heads its gates.
    """
    args = model_args(state)
    enc = (args.encoder_layers, args.encoder_attention_heads)
    dec = (args.decoder_layers, args.decoder_attention_heads)
    return {ENC_SELF: enc, DEC_SELF: dec, DEC_ENC: dec}


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


def half_weights(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` with its floating-point tensors cast to fp16 (for a smaller file; fairseq loads
    them into an fp32 model). Tensors that share storage (tied embeddings) stay shared, so
    they are stored once."""
    cast: dict[tuple, torch.Tensor] = {}
    out = {}
    for key, value in sd.items():
        if value.is_floating_point():
            view = (value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
            out[key] = cast.setdefault(view, value.half())
        else:
            out[key] = value
    return out


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's 0600 → what open() would give
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
