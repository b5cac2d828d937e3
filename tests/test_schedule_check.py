"""The start-up schedule check (``schedule_check``): hand-computed learning-rate sums, and the
real fairseq-train stopping a run whose gates cannot close before its first update."""

import math
from argparse import Namespace

import numpy as np
import pytest

from fairseq_headprune import schedule_check
from fairseq_headprune.errors import HeadpruneError
from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli, load_state, train

# log α 3.0 → ln(0.1 / 1.1) = −2.3979: the distance a gate moves to close
DISTANCE = 3.0 - math.log(0.1 / 1.1)


def _args(**kw) -> Namespace:
    """fairseq-train's flat namespace of a --l0-lambda run at the recipe's settings."""
    base = dict(
        lr=[5e-4], lr_scheduler="fixed", warmup_updates=0, optimizer="adam", max_update=0,
        max_epoch=10, update_freq=[1], head_gates="enc-self",
        criterion="label_smoothed_cross_entropy_l0", l0_lambda=0.05, target_heads=None,
        target_heads_warmup_updates=0, head_gate_lr_scale=20.0, head_gate_init_log_alpha=3.0,
        head_gate_stretch_low=-0.1, head_gate_stretch_high=1.1, allow_slow_gates=False,
    )  # fmt: skip
    return Namespace(**(base | kw))


def _moves(args, rate, distance, horizon=10**6):
    schedule, _ = schedule_check.lr_schedule(args)
    return schedule_check.updates_to_move(schedule, rate, distance, horizon)


def test_fixed_schedule_by_hand():
    # 5.3979 / 5e-4 = 10,795.8 updates at scale 1; / (5e-4 · 20) = 539.8 at scale 20
    assert _moves(_args(), 1.0, DISTANCE) == 10_796
    assert _moves(_args(), 20.0, DISTANCE) == 540
    # warm-up over 4 updates: lr 0.25, 0.5, 0.75, 1, 1, ... → sums 0.25, 0.75, 1.5, 2.5, 3.5
    warm = _args(lr=[1.0], warmup_updates=4)
    assert [_moves(warm, 1.0, d) for d in (0.25, 0.3, 2.5, 3.0)] == [1, 2, 4, 5]
    assert _moves(_args(lr=[1e-4, 5e-4]), 1.0, 1.0001) == 2001  # per-epoch lrs: the largest


def test_inverse_sqrt_and_polynomial_schedules_by_hand():
    # warm-up 4 from 0: 0, 0.25, 0.5, 0.75, then 1·√4/√n: 1 (n = 4), 2/√5 = 0.894 → 3.394
    inv = _args(lr=[1.0], lr_scheduler="inverse_sqrt", warmup_updates=4, warmup_init_lr=-1)
    assert [_moves(inv, 1.0, d) for d in (0.2, 1.5, 2.5, 3.0, 3.394)] == [2, 4, 5, 6, 6]
    # total 4, end 0, power 1: 1, 0.75, 0.5, 0.25, 0, ... → sums 1, 1.75, 2.25, 2.5 and no more
    poly = _args(lr=[1.0], lr_scheduler="polynomial_decay", total_num_update=4,
                 end_learning_rate=0.0, power=1.0)  # fmt: skip
    assert [_moves(poly, 1.0, d) for d in (1.0, 2.0, 2.5)] == [1, 3, 4]
    assert _moves(poly, 1.0, 2.6) is None
    # an unknown scheduler: its peak lr on every update (an overestimate of the movement)
    cosine = _args(lr=[0.5], lr_scheduler="cosine", max_lr=1.0)
    assert _moves(cosine, 1.0, 3.0) == 3


def test_run_updates():
    assert schedule_check.run_updates(_args(max_epoch=0), 136) == (None, "")
    assert schedule_check.run_updates(_args(), 136) == (1360, "--max-epoch 10 × 136")
    assert schedule_check.run_updates(_args(max_update=900), 136) == (900, "--max-update 900")
    assert schedule_check.run_updates(_args(max_update=900, max_epoch=0), None)[0] == 900


def test_check_refuses_the_old_default_scale_on_the_documented_schedule():
    schedule_check.check_schedule(_args(), 136)  # scale 20: 540 updates of 1,360
    with pytest.raises(HeadpruneError) as e:
        schedule_check.check_schedule(_args(head_gate_lr_scale=1.0), 136)
    message = str(e.value)
    assert "\n" not in message
    assert "needs about 10,796 updates" in message and "the run has 1,360" in message
    # 5.3979 / (1,360 · 5e-4) = 7.94: the scale that closes a gate at lr per update
    assert "set --head-gate-lr-scale 8 or more" in message and "--allow-slow-gates" in message
    # stopped only when a gate could not close even at twice lr per update: 5,398 updates
    schedule_check.check_schedule(_args(head_gate_lr_scale=1.0, max_update=5398), None)
    with pytest.raises(HeadpruneError, match="the run has 5,397"):
        schedule_check.check_schedule(_args(head_gate_lr_scale=1.0, max_update=5397), None)


def test_check_of_the_budget_warmup_and_what_it_leaves_alone():
    budget = dict(l0_lambda=0.0, target_heads="10", target_heads_warmup_updates=1360)
    with pytest.raises(HeadpruneError, match="--target-heads-warmup-updates 1360: the target"):
        schedule_check.check_schedule(_args(**budget), 136)
    schedule_check.check_schedule(_args(**budget | {"target_heads_warmup_updates": 900}), 136)
    slow = dict(head_gate_lr_scale=1.0)
    for quiet in (
        dict(allow_slow_gates=True),
        dict(l0_lambda=0.0),  # gates not trained
        dict(head_gates="none"),
        dict(criterion="label_smoothed_cross_entropy"),
        dict(optimizer="sgd"),  # the check assumes Adam
        dict(max_epoch=0),  # no end: nothing to check
    ):
        schedule_check.check_schedule(_args(**slow | quiet), 136)


def test_updates_per_epoch_from_the_task():
    class Task:
        datasets = {"train": "the train set"}
        dataset_to_epoch_iter = {"the train set": list(range(11))}  # 11 batches

    args = _args(train_subset="train", update_freq=[2])
    assert schedule_check.updates_per_epoch(args, Task) == 6
    assert schedule_check.updates_per_epoch(_args(train_subset="other"), Task) is None
    assert np.isclose(DISTANCE, 5.3979, atol=1e-4)


# ---------------------------------------------------------------- real fairseq-train

L0 = [
    "--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1",
    "--l0-lambda", "0.5", "--head-gates", "enc-self", "--freeze-decoder",
]  # fmt: skip


def _train(tiny_data, save, stock, *extra, check=True):
    return cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--save-dir", save, *L0, "--finetune-from-model", stock,
        *extra, check=check,
    )  # fmt: skip


def test_fairseq_train_stops_a_run_whose_gates_cannot_close(stock_checkpoint, tiny_data, tmp_path):
    # 3 epochs of 10 updates at --lr 5e-4 (fixed) and the old scale 1; TRAIN_COMMON's 20
    # warm-up updates give 10.5 lr instead of 20: 10,795.8 + 9.5 updates
    slow = ["--lr", "5e-4", "--lr-scheduler", "fixed", "--head-gate-lr-scale", "1"]
    proc = _train(tiny_data, tmp_path / "slow", stock_checkpoint, *slow, "--max-epoch", "3",
                  check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "a head gate needs about 10,806 updates" in proc.stderr
    assert "the run has 30 (--max-epoch 3 × 10)" in proc.stderr
    assert not list((tmp_path / "slow").iterdir())  # stopped before anything was written
    # with --max-update, and with a --target-heads warm-up longer than the run
    proc = _train(tiny_data, tmp_path / "budget", stock_checkpoint, "--l0-lambda", "0",
                  "--target-heads", "3", "--target-heads-warmup-updates", "40",
                  "--max-update", "40", check=False)  # fmt: skip
    assert "--target-heads-warmup-updates 40: the target reaches K only after" in proc.stderr
    assert not list((tmp_path / "budget").iterdir())
    # acknowledged: the same run trains
    ckpt = tmp_path / "ok" / "checkpoint_last.pt"
    _train(tiny_data, tmp_path / "ok", stock_checkpoint, *slow, "--max-epoch", "1",
           "--allow-slow-gates")  # fmt: skip
    assert load_state(ckpt)["optimizer_history"][-1]["num_updates"] == 10


def test_default_scale_prunes_on_the_tiny_schedule(stock_checkpoint, tiny_data, tmp_path):
    """No --head-gate-lr-scale: the default (20) passes the check and is saved with the run."""
    ckpt = train(
        tiny_data, tmp_path, *L0, "--max-epoch", "8", "--finetune-from-model", stock_checkpoint,
        arch="gated_transformer",
    )  # fmt: skip
    assert load_state(ckpt)["cfg"]["model"].head_gate_lr_scale == 20.0
