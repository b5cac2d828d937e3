"""Errors a user can act on, shared by the plugin's fairseq components and its CLI.

Part of fairseq-headprune (Voita et al. 2019, "Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"): a wrong flag, file or value
is reported as one line that names it, what was given and what is allowed.

Inside the fairseq CLIs (``fairseq-train``, ``-generate``, ``-validate``, ``-interactive``
load this package through ``--user-dir``) the plugin's errors are raised deep in fairseq,
which sometimes wraps them in its own generic message ("please ensure that the architectures
match"). :func:`install_excepthook`, called when the package is imported, makes the process
end on the plugin's own diagnosis instead: for an uncaught exception whose chain
(``__cause__``/``__context__``) holds a :class:`HeadpruneError`, or a checkpoint that
``torch.load`` could not read or refused, it prints ``error: <message>`` as the last line
(the traceback only with ``HEADPRUNE_TRACEBACK=1``); Python then exits with status 1.
Every other exception keeps Python's default report.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from collections.abc import Iterator
from types import TracebackType

# Set to 1 to see the traceback above the one-line message.
TRACEBACK_ENV = "HEADPRUNE_TRACEBACK"


class HeadpruneError(ValueError):
    """An input error the user can fix (a flag, a file, a value): shown as one line."""


# How a HeadpruneError appears in the text of another process's traceback.
_SPAWNED_ERROR = re.compile(r"^fairseq_headprune\.errors\.HeadpruneError: (.+)$", re.MULTILINE)


def check_value(flag: str, value: float, ok: bool, allowed: str) -> None:
    """Raise ``HeadpruneError`` naming ``flag`` unless ``value`` is finite and ``ok``.

    ``ok`` is the flag's own condition (``value > 0`` …); NaN and infinity never pass.
    """
    if not (math.isfinite(value) and ok):
        raise HeadpruneError(f"{flag} {value}: must be {allowed}")


def read_json(path: str, flag: str):
    """The JSON document of the file ``flag`` names; a missing or malformed file is one line."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise HeadpruneError(f"{flag} {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HeadpruneError(f"{flag} {path}: not valid JSON ({e})") from e


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exceptions it was raised from or while handling, newest first."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _torch_load_source(exc: BaseException) -> str | None:
    """The file ``torch.load`` was reading when ``exc`` was raised inside it, if it was."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if code.co_name == "load" and code.co_filename.endswith(
            os.path.join("torch", "serialization.py")
        ):
            source = frame.f_locals.get("f")
            return str(getattr(source, "name", source))
    return None


def user_error(exc: BaseException) -> HeadpruneError | None:
    """The input error behind ``exc``: a HeadpruneError in its chain, or a failed torch.load."""
    chain = list(exception_chain(exc))
    for e in chain:
        if isinstance(e, HeadpruneError):
            return e
    for e in chain:
        # a spawned worker's exception reaches the parent as the text of its traceback
        # (torch.multiprocessing's ProcessRaisedException)
        spawned = _SPAWNED_ERROR.search(str(e))
        if spawned:
            return HeadpruneError(spawned.group(1).strip())
    for e in chain:
        source = _torch_load_source(e) if isinstance(e, Exception) else None
        if source is not None:
            from fairseq_headprune.checkpoint_safety import load_error

            return load_error(e, source)
    return None


def show_traceback() -> bool:
    """Whether ``HEADPRUNE_TRACEBACK`` asks for the traceback above the one-line message."""
    return os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0")


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    err = user_error(exc) if isinstance(exc, Exception) else None
    if err is None:
        sys.__excepthook__(exc_type, exc, tb)
        return
    if show_traceback():
        sys.__excepthook__(exc_type, exc, tb)
    sys.stdout.flush()
    print(f"error: {err}", file=sys.stderr, flush=True)
    # Python then exits with status 1, as for any uncaught exception


def install_excepthook() -> None:
    """Report uncaught input errors as one line (see the module docstring); idempotent."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
