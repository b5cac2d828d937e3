#!/usr/bin/env bash
# The main job at reduced size: the committed converged baseline (models/multi30k-en-de, a
# stock transformer with 6 encoder layers x 8 heads) -> real Multi30k en->de encoded with its
# SentencePiece model -> Voita et al.'s encoder-only gated pruning to an exact budget of 10
# encoder heads -> the closed heads physically removed (export) -> sacreBLEU on
# test_2016_flickr for both -> the heads kept. Resumable; every step skips finished work.
#
# Settings: WORK_DIR [$HOME/headprune-runs/quickstart], RAW_DIR (see prepare.sh),
# PRUNE_EPOCHS [2], TARGET_HEADS [10], TARGET_WARMUP [200], GATE_LR_SCALE [60];
# TARGET_HEADS= (empty) prunes with LAMBDA [0.05] instead; TRAIN_BASELINE=1 trains a baseline
# of BASELINE_EPOCHS [4] epochs first instead of using the committed one (the tests do, at
# tiny size). 2 pruning epochs are 272 updates: at prune.sh's gate scale of 20 a gate needs
# 540 to close, so the quickstart moves the gates 3 times faster (180 updates); the target
# reaches K at update 200 and the gates settle on exactly K after. recipes/full.sh is the
# whole study (two-phase protocol, controls, seeds).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export WORK_DIR="${WORK_DIR:-$HOME/headprune-runs/quickstart}"
source "$HERE/lib/common.sh"
BASELINE_EPOCHS="${BASELINE_EPOCHS:-4}"
PRUNE_EPOCHS="${PRUNE_EPOCHS:-2}"
export TARGET_HEADS="${TARGET_HEADS-10}" TARGET_WARMUP="${TARGET_WARMUP:-200}"
export LAMBDA="${LAMBDA:-0.05}"
export GATE_LR_SCALE="${GATE_LR_SCALE:-60}"
tag="$(prune_tag)"
name="pruned-$tag"

if [[ "${TRAIN_BASELINE:-0}" == 1 ]]; then
  bash "$HERE/prepare.sh"
  MAX_EPOCH="$BASELINE_EPOCHS" PATIENCE=0 bash "$HERE/train_baseline.sh"
  export BASELINE="$WORK_DIR/baseline/checkpoint_best.pt"
else
  export BASELINE="$REPO_ROOT/models/multi30k-en-de/baseline.pt"
  VOCAB_FROM="$REPO_ROOT/models/multi30k-en-de" bash "$HERE/prepare.sh"
fi
export PRUNE_DIR="$WORK_DIR/prune/enc-self-$tag"
MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh"
export SUBSETS="${SUBSETS:-test}"
bash "$HERE/evaluate.sh" baseline "$BASELINE"
bash "$HERE/evaluate.sh" "$name" "$PRUNE_DIR/checkpoint_last.pt"

echo
study quickstart_table "$WORK_DIR/eval" "$BASELINE" \
  "$name=$PRUNE_DIR/checkpoint_last.pt"
bash "$HERE/report.sh" >/dev/null
echo "report: $WORK_DIR/report/report.md"
echo "pruned model, closed heads removed: $PRUNE_DIR/pruned.pt"
echo "runs: $WORK_DIR"
