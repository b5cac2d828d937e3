#!/usr/bin/env bash
# The H200 25-epoch baseline continued on the CPU with the recipe's settings, resumable.
# checkpoint_last.pt = the H200 checkpoint_best.pt (epoch 25) + a fresh Adam state
# (add_fresh_adam.py here), so fairseq resumes at epoch 26, update 3400.
# Session 7: epochs 26-35 (MAX_EPOCH=60, stopped). Session 8: epochs 36-51 (MAX_EPOCH=60), then,
# stopped after epoch 51 and resumed with MAX_EPOCH=55 (the stopping rule in docs/results.md),
# epochs 52-55. Valid BLEU of the state every fifth epoch: evaluate.sh with SUBSETS=valid.
set -euo pipefail
cd /work/snap7   # a worktree of this repository with its own .venv
source .venv/bin/activate
export OMP_NUM_THREADS=2
BASELINE_DIR=$HOME/headprune-runs/multi30k/baseline-long MAX_EPOCH=${MAX_EPOCH:-60} bash recipes/train_baseline.sh
# every 5th epoch: cp $BASELINE_DIR/checkpoint_last.pt /work/runs/baseline-long-last-eN.pt, then
# SUBSETS=valid bash recipes/evaluate.sh baseline-long-last-eN /work/runs/baseline-long-last-eN.pt
