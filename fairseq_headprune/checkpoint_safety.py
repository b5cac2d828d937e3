"""Let fairseq load its own checkpoints under torch >= 2.6's safe ``torch.load``.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True`` and refuses any pickled
class that is not allow-listed. fairseq 0.12 checkpoints hold a few such classes besides
tensors (the argparse ``Namespace`` of the model config; in distributed training the loaded
state, whose config is then an omegaconf ``DictConfig``, is re-pickled and broadcast), so
stock ``fairseq-generate``, ``fairseq-validate``, ``fairseq-interactive`` and
``fairseq-train --restore-file`` fail on them. Importing this plugin allow-lists exactly
those classes: safe loading stays on for everything else, no environment variable needed.

A checkpoint that ``torch.load`` cannot read or refuses is described in one line by
:func:`load_error` (not a checkpoint, empty, truncated, or refused for a class that is not
allow-listed), both for this package's loader (``checkpoint_io.load_checkpoint``) and for
fairseq's own loading (``errors.install_excepthook``). It never suggests turning safe
loading off.

Supports the tools of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned"), which all start from a checkpoint.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import typing
import zipfile

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

from fairseq_headprune.errors import HeadpruneError

# Every non-tensor class found in checkpoints written by fairseq 0.12 translation training
# and in the state it broadcasts to other ranks (tests/test_checkpoint_safety.py checks them
# with torch.serialization's own inspector).
FAIRSEQ_CHECKPOINT_GLOBALS: list = [
    argparse.Namespace,
    # an omegaconf config as fairseq holds it in memory
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    StringNode,
    IntegerNode,
    FloatNode,
    BooleanNode,
    typing.Any,
    dict,
    list,
    int,
    collections.defaultdict,
    # numpy scalars and their dtypes, in case a meter or metric was saved as one.
    getattr(np, "_core", getattr(np, "core", None)).multiarray.scalar,
    np.dtype,
    *{type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int32, np.int64)},
]


def checkpoint_globals() -> list:
    """The classes to allow: :data:`FAIRSEQ_CHECKPOINT_GLOBALS`, and once fairseq is imported
    the placeholders its ``broadcast_object`` leaves where it sends tensors apart to other
    ranks (only fairseq itself writes them, so a process without fairseq never needs them)."""
    if "fairseq" not in sys.modules:
        return list(FAIRSEQ_CHECKPOINT_GLOBALS)
    from fairseq.distributed.utils import _TensorPlaceholder

    return [*FAIRSEQ_CHECKPOINT_GLOBALS, _TensorPlaceholder]


def allow_fairseq_checkpoints() -> None:
    """Allow-list the classes of fairseq checkpoints for ``torch.load(weights_only=True)``."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(checkpoint_globals())


# torch's WeightsUnpickler names the refused class as "GLOBAL module.Class".
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def load_error(exc: Exception, path: str | os.PathLike) -> HeadpruneError:
    """One line for a checkpoint ``torch.load(path, weights_only=True)`` failed on with ``exc``."""
    refused = _REFUSED_GLOBAL.search(str(exc))
    if refused:
        return HeadpruneError(
            f"{path}: refused to load: it contains an object that is not allow-listed "
            f"({refused.group(1)}); a fairseq checkpoint holds only tensors and fairseq's "
            "configuration, and unpickling anything else could run code from the file: "
            "use a checkpoint written by fairseq-train or fairseq-headprune export"
        )
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        size, magic = -1, b""
    if size == 0:
        return HeadpruneError(f"{path} is empty, not a checkpoint")
    if magic == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return HeadpruneError(
            f"{path} is truncated or damaged (an incomplete torch archive of {size:,} bytes): "
            "copy or save it again"
        )
    if magic != b"PK\x03\x04":
        return HeadpruneError(
            f"{path} is not a checkpoint (not a file written by torch.save, "
            f"{type(exc).__name__} while reading it)"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return HeadpruneError(f"{path} is a damaged checkpoint: torch.load failed: {first}")
