"""recipes/prune.sh's two-phase protocol: gates (phase 1), then the exported structure
fine-tuned without gates or penalty (phase 2), once per seed, resumable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import BIN, REPO, load_state

RECIPE = REPO / "recipes" / "prune.sh"
TINY = {"EXTRA_ARGS": "--cpu --num-workers 0", "OMP_NUM_THREADS": "1", "MAX_TOKENS": "500"}


def prune(data: Path, baseline: Path, run: Path, **env: str) -> str:
    full = {**os.environ, **TINY, "DATA_BIN": str(data), "BASELINE": str(baseline),
            "SRC": "src", "TGT": "tgt", "PRUNE_DIR": str(run), "WORK_DIR": str(run.parent),
            **env}  # fmt: skip
    full["PATH"] = f"{BIN}{os.pathsep}{full['PATH']}"
    proc = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, env=full)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stderr


def test_joint_two_phase_trains_the_exported_structure_per_seed(
    tiny_data, stock_checkpoint, tmp_path
):
    run = tmp_path / "joint-k12"
    env = dict(TARGET_HEADS="12", TARGET_WARMUP="2", MAX_EPOCH="6", GATE_LR_SCALE="1000",
               HEAD_GATES="enc-self,dec-self,dec-enc", FREEZE_DECODER="0",
               PHASE2_EPOCHS="2", PHASE2_SEEDS="1 2", PATIENCE="1")  # fmt: skip
    prune(tiny_data, stock_checkpoint, run, **env)
    exported = load_state(run / "pruned.pt")["model"]
    for seed in (1, 2):
        phase2 = run / f"phase2-s{seed}"
        assert (phase2 / "DONE").exists() and (phase2 / "checkpoint_best.pt").exists()
        log = (phase2 / "train.log").read_text()
        # no gates, no penalty, the decoder trained (decoder heads were pruned), this seed
        assert "'head_gates': 'none'" in log or "head_gates='none'" in log, log[:3000]
        assert "label_smoothed_cross_entropy_l0" not in log
        assert "freeze_decoder': False" in log or "freeze_decoder=False" in log
        assert f"'seed': {seed}" in log or f"seed={seed}" in log
        assert "'patience': 1" in log or "patience=1" in log
        model = load_state(phase2 / "checkpoint_best.pt")["model"]
        assert not any(k.endswith("head_gate.theta") for k in model)
        shapes = {k: v.shape for k, v in exported.items()}
        assert {k: v.shape for k, v in model.items()} == shapes  # the exported structure
    # the decoder changed in phase 2 (it is trained when decoder heads were pruned)
    key = "decoder.layers.0.fc1.weight"
    assert not load_state(run / "phase2-s1" / "checkpoint_best.pt")["model"][key].equal(
        exported[key]
    )
    # resumable: a rerun finds every step done and trains nothing
    before = (run / "phase2-s1" / "train.log").read_text()
    err = prune(tiny_data, stock_checkpoint, run, **env)
    assert "already pruned" in err and "already fine-tuned" in err
    assert (run / "phase2-s1" / "train.log").read_text() == before


def test_encoder_only_phase2_keeps_the_decoder_frozen(tiny_data, stock_checkpoint, tmp_path):
    run = tmp_path / "enc-k3"
    prune(tiny_data, stock_checkpoint, run, TARGET_HEADS="3", TARGET_WARMUP="2",
          MAX_EPOCH="6", GATE_LR_SCALE="1000", PHASE2_EPOCHS="1")  # fmt: skip
    exported = load_state(run / "pruned.pt")["model"]
    tuned = load_state(run / "phase2-s1" / "checkpoint_last.pt")["model"]
    decoder = [k for k in exported if k.startswith("decoder.") and "head_gate" not in k]
    assert decoder and all(tuned[k].equal(exported[k].to(tuned[k].dtype)) for k in decoder)
    encoder = "encoder.layers.0.fc1.weight"
    assert not tuned[encoder].equal(exported[encoder])
    assert not (run / "phase2-s2").exists()  # PHASE2_SEEDS defaults to one seed
