#!/usr/bin/env bash
# Session 7: a CPU baseline with 2048-token batches (twice the updates per epoch), resumable.
set -euo pipefail
cd /work/snap7
export OMP_NUM_THREADS=2
BASELINE_DIR=$HOME/headprune-runs/multi30k/baseline-t2048 MAX_TOKENS=2048 MAX_EPOCH=60 \
  bash recipes/train_baseline.sh
