"""A start-up check that a run's schedule lets a head gate close at all.

The Hard Concrete gates of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, section 6) start
open (log α = ``--head-gate-init-log-alpha``, 3.0) and a head is removed once its
deterministic gate reaches 0, at log α = ln(−l / r) ≈ −2.40 (``hard_concrete``). Under Adam a
parameter moves about lr per update, and log α = lr_scale · θ, so a gate moves about
lr · ``--head-gate-lr-scale`` per update: at ``--lr 5e-4`` and a scale of 1 a gate needs about
10,800 updates to close, and a fine-tuning of a thousand updates ends with every head open.

:func:`check_schedule` sums the learning rate that fairseq's scheduler gives each update
(``fixed``, ``inverse_sqrt``, ``polynomial_decay``; any other scheduler is taken at its peak
learning rate throughout, which can only overestimate how far a gate moves) over the run's
updates (``--max-update``, or ``--max-epoch`` × updates per epoch) and stops the run with a
``HeadpruneError`` before the first update when a gate could not close within it even at
``ADAM_ALLOWANCE`` times lr per update. Adam's step exceeds lr while a gradient grows, as the
L0 gradient does while log α falls (σ'(log α) rises from 0.02 at 3.8 to 0.25 at 0), so the
check only stops runs that are short by more than that factor. With ``--target-heads`` the
target must also reach K within the run (``--target-heads-warmup-updates`` < the run's
updates). ``--allow-slow-gates`` turns the check off for a run meant that way.

The check runs from ``GatedTransformerModel.train()``, which fairseq's trainer calls at the
start of every training step (outside the step's ``crash.pt`` handler): by then the train
set's batches are made, and nothing has been written to ``--save-dir``.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from fairseq_headprune.errors import HeadpruneError

logger = logging.getLogger(__name__)

# A gate must be able to close even if Adam's steps were this many times lr (see docstring).
ADAM_ALLOWANCE = 2.0
# Optimisers whose step is about lr whatever the gradient's scale.
ADAPTIVE_OPTIMIZERS = ("adam", "cpu_adam", "adamax")
_CHUNK = 1 << 20
# "updates a gate needs" is searched up to this many times the run (at least _LOOKAHEAD_MIN)
_LOOKAHEAD, _LOOKAHEAD_MIN = 100, 10**7

Schedule = Callable[[np.ndarray], np.ndarray]


def lr_schedule(args: Any) -> tuple[Schedule, str]:
    """The learning rate of update n + 1 (n updates done) as fairseq sets it, and a name.

    ``args``: fairseq-train's flat namespace (``lr``, ``lr_scheduler``, ``warmup_updates``, …).
    """
    lrs = [float(x) for x in np.atleast_1d(args.lr)]
    peak = max(lrs)
    name = str(getattr(args, "lr_scheduler", "fixed"))
    warmup = int(getattr(args, "warmup_updates", 0) or 0)
    if name == "fixed":
        if warmup <= 0:
            return (lambda n: np.full(n.shape, peak)), name
        return (lambda n: peak * np.minimum((n + 1) / warmup, 1.0)), name
    if name == "inverse_sqrt" and warmup > 0:
        init = float(getattr(args, "warmup_init_lr", -1))
        init = 0.0 if init < 0 else init
        step = (peak - init) / warmup

        def inverse_sqrt(n: np.ndarray) -> np.ndarray:
            decay = peak * math.sqrt(warmup) / np.sqrt(np.maximum(n, 1))
            return np.where(n < warmup, init + n * step, decay)

        return inverse_sqrt, name
    if name == "polynomial_decay":
        end = float(getattr(args, "end_learning_rate", 0.0))
        total = int(getattr(args, "total_num_update", 0) or 0)
        power = float(getattr(args, "power", 1.0))

        def polynomial(n: np.ndarray) -> np.ndarray:
            frac = np.clip((n - warmup) / max(total - warmup, 1), 0.0, 1.0)
            decay = (peak - end) * (1 - frac) ** power + end
            return np.where(n <= warmup, peak * n / max(warmup, 1), decay) if warmup else decay

        return polynomial, name
    peak = max(peak, float(getattr(args, "max_lr", 0.0) or 0.0))
    return (lambda n: np.full(n.shape, peak)), f"{name}, taken at its peak lr"


def updates_to_move(schedule: Schedule, rate: float, distance: float, horizon: int) -> int | None:
    """Fewest updates after which Σ rate · lr ≥ ``distance``; None if not within ``horizon``."""
    if distance <= 0:
        return 0
    moved, start = 0.0, 0
    while start < horizon:
        n = np.arange(start, min(start + _CHUNK, horizon), dtype=np.float64)
        total = moved + np.cumsum(rate * schedule(n))
        reached = np.nonzero(total >= distance)[0]
        if reached.size:
            return start + int(reached[0]) + 1
        moved, start = float(total[-1]), start + n.size
    return None


def run_updates(args: Any, updates_per_epoch: int | None) -> tuple[int | None, str]:
    """The run's number of updates (None: unbounded or unknown) and how it was counted."""
    limits = []
    max_update = int(getattr(args, "max_update", 0) or 0)
    max_epoch = int(getattr(args, "max_epoch", 0) or 0)
    if max_update > 0:
        limits.append((max_update, f"--max-update {max_update}"))
    if max_epoch > 0 and updates_per_epoch:
        limits.append(
            (max_epoch * updates_per_epoch, f"--max-epoch {max_epoch} × {updates_per_epoch}")
        )
    if not limits:
        return None, ""
    return min(limits)


def gates_trained(args: Any) -> bool:
    """Gated sites trained by the L0 criterion with a penalty or a head budget."""
    if str(getattr(args, "head_gates", "none")).strip().lower() in ("", "none"):
        return False
    if getattr(args, "criterion", None) != "label_smoothed_cross_entropy_l0":
        return False
    budget = str(getattr(args, "target_heads", None) or "").strip().lower()
    return float(getattr(args, "l0_lambda", 0.0) or 0.0) > 0 or budget not in ("", "none")


def check_schedule(args: Any, updates_per_epoch: int | None) -> None:
    """Raise ``HeadpruneError`` when a gate cannot close within the run (see module doc)."""
    if getattr(args, "allow_slow_gates", False) or not gates_trained(args):
        return
    if getattr(args, "optimizer", "adam") not in ADAPTIVE_OPTIMIZERS:
        logger.warning(
            f"--optimizer {args.optimizer}: the gate schedule check assumes Adam; not checked"
        )
        return
    total, counted = run_updates(args, updates_per_epoch)
    if total is None:
        return
    budget = str(getattr(args, "target_heads", None) or "").strip().lower()
    warmup = int(getattr(args, "target_heads_warmup_updates", 0) or 0)
    if budget not in ("", "none") and warmup >= total:
        raise HeadpruneError(
            f"--target-heads-warmup-updates {warmup}: the target reaches K only after the "
            f"run's {total} updates ({counted}); give a shorter warm-up or more updates, or "
            "pass --allow-slow-gates"
        )
    scale = float(args.head_gate_lr_scale)
    close = math.log(-args.head_gate_stretch_low / args.head_gate_stretch_high)
    distance = float(args.head_gate_init_log_alpha) - close
    schedule, name = lr_schedule(args)
    if updates_to_move(schedule, ADAM_ALLOWANCE * scale, distance, total) is not None:
        return
    horizon = max(total * _LOOKAHEAD, _LOOKAHEAD_MIN)
    need = updates_to_move(schedule, scale, distance, horizon)
    need_text = f"about {need:,}" if need else f"more than {horizon:,}"
    moved = scale * float(schedule(np.arange(total, dtype=np.float64)).sum())
    advised = math.ceil(scale * distance / moved) if moved > 0 else math.inf
    raise HeadpruneError(
        f"a head gate needs {need_text} updates to close (log α {args.head_gate_init_log_alpha}"
        f" → {close:.2f} at about lr × --head-gate-lr-scale {scale:g} per update, --lr "
        f"{max(np.atleast_1d(args.lr)):g}, {name} scheduler) but the run has {total:,} "
        f"({counted}): set --head-gate-lr-scale {advised} or more (or give more updates), "
        "or pass --allow-slow-gates"
    )


def updates_per_epoch(args: Any, task: Any) -> int | None:
    """Updates per epoch from the train set's batch iterator, once fairseq has made it."""
    dataset = getattr(task, "datasets", {}).get(getattr(args, "train_subset", "train"))
    itr = getattr(task, "dataset_to_epoch_iter", {}).get(dataset) if dataset else None
    if itr is None:
        return None
    freq = min(np.atleast_1d(getattr(args, "update_freq", [1]) or [1]))
    return math.ceil(len(itr) / int(freq))


def remember_task(model: Any, task: Any) -> None:
    """Keep a weak reference to the task the model was built for (for :func:`on_train`)."""
    model._schedule_task = weakref.ref(task) if task is not None else None
    model._schedule_checked = False


def on_train(model: Any) -> None:
    """Check once, at the first training step of a run (the train set's batches made)."""
    if getattr(model, "_schedule_checked", True):
        return
    task = model._schedule_task() if model._schedule_task else None
    args = model.args
    if task is None or getattr(task, "datasets", {}).get(args.train_subset) is None:
        return  # not in a training run (evaluation, scoring): nothing to check
    model._schedule_checked = True
    per_epoch = updates_per_epoch(args, task)
    if per_epoch is None and int(getattr(args, "max_update", 0) or 0) <= 0:
        logger.warning("the train set's batches are not known: the gate schedule is not checked")
        return
    check_schedule(args, per_epoch)
