#!/usr/bin/env bash
# Session 7: continue the H200 25-epoch baseline on the CPU (same recipe settings), resumable.
# checkpoint_last.pt = the H200 checkpoint_best.pt (epoch 25) + a fresh Adam state
# (/work/runs/add_fresh_adam.py), so fairseq resumes at epoch 26, update 3400.
set -euo pipefail
cd /work/snap7
export OMP_NUM_THREADS=2
BASELINE_DIR=$HOME/headprune-runs/multi30k/baseline-long MAX_EPOCH=60 bash recipes/train_baseline.sh
