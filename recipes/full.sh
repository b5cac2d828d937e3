#!/usr/bin/env bash
# The whole study of Voita et al. 2019 on Multi30k in one command: prepare -> stock baseline ->
# encoder-only pruning for a sweep of λ (and exact budgets) with the decoder frozen -> joint
# pruning of all three attention types -> the paper's controls at each pruned run's head
# count -> sacreBLEU of every model on the three test sets -> report (table, BLEU-vs-heads
# plot, BLEU by source length, when each gate closed against the baseline's head scores).
#
# Each step is one of the other recipes (read their headers for the fairseq commands and
# their settings, which pass through); every step skips finished work, so rerunning the
# command continues an interrupted study. On 2 CPU cores the defaults take days (a pruning
# run is about 40 minutes, the baseline and each from-scratch control about 4 hours); a GPU
# runs the same commands unchanged.
#
# Settings (environment variables, defaults in brackets):
#   LAMBDAS       encoder-only --l0-lambda sweep ["0.01 0.02 0.03 0.05"]
#   TARGETS       encoder-only --target-heads runs, e.g. "10 4" [""]
#   JOINT_LAMBDAS λ of the joint runs (HEAD_GATES enc-self,dec-self,dec-enc, decoder not
#                 frozen) ["0.03"]; "" skips them
#   CONTROLS      controls.sh's controls at each encoder-only run's budget
#                 ["masked refit scratch random michel lrp"]; "" skips them
#   CONTROL_CHECKPOINT  the fine-tuned controls' checkpoints evaluated [both: the best by
#                 validation nll, and the last as <name>-last, the pruning runs' own rule]
#   BASELINE_EPOCHS [55]  PRUNE_EPOCHS (= FT_EPOCHS of the controls) [10]
#   SCORE_SENTENCES valid sentences for the baseline's head scores [2000, i.e. all]
# Outputs: $WORK_DIR/{baseline,prune,controls,eval,scores-baseline,report}; the report is
# $WORK_DIR/report/report.md with trajectory-<run>.txt per pruning run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
export WORK_DIR SRC TGT DATA_BIN

LAMBDAS="${LAMBDAS:-0.01 0.02 0.03 0.05}"
TARGETS="${TARGETS:-}"
JOINT_LAMBDAS="${JOINT_LAMBDAS-0.03}"
CONTROLS="${CONTROLS-masked refit scratch random michel lrp}"
CONTROL_CHECKPOINT="${CONTROL_CHECKPOINT:-both}"
BASELINE_EPOCHS="${BASELINE_EPOCHS:-$BASELINE_EPOCHS_DEFAULT}"
PRUNE_EPOCHS="${PRUNE_EPOCHS:-10}"
SCORE_SENTENCES="${SCORE_SENTENCES:-2000}"
JOINT_GATES=enc-self,dec-self,dec-enc

bash "$HERE/prepare.sh"
MAX_EPOCH="$BASELINE_EPOCHS" bash "$HERE/train_baseline.sh"
export BASELINE="$WORK_DIR/baseline/checkpoint_best.pt"
bash "$HERE/evaluate.sh" baseline "$BASELINE"

# The baseline's head scores: what the gate trajectories are correlated with.
scores="$WORK_DIR/scores-baseline"
[[ -s "$scores/heads.json" ]] || fairseq-headprune score "$DATA_BIN" --path "$BASELINE" \
  --subset valid --metrics lrp,confidence,entropy,positional,rare,importance \
  --max-sentences "$SCORE_SENTENCES" --out "$scores" --force

# Pruning runs: NAME DIR (encoder-only ones also get the controls).
runs=() encoder_runs=()
for lambda in $LAMBDAS; do
  dir="$WORK_DIR/prune/enc-self-l$lambda"
  LAMBDA="$lambda" PRUNE_DIR="$dir" MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh"
  runs+=("pruned-l$lambda=$dir") encoder_runs+=("$dir")
done
for k in $TARGETS; do
  dir="$WORK_DIR/prune/enc-self-k$k"
  TARGET_HEADS="$k" PRUNE_DIR="$dir" MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh"
  runs+=("pruned-k$k=$dir") encoder_runs+=("$dir")
done
for lambda in $JOINT_LAMBDAS; do
  dir="$WORK_DIR/prune/joint-l$lambda"
  LAMBDA="$lambda" PRUNE_DIR="$dir" HEAD_GATES="$JOINT_GATES" FREEZE_DECODER=0 \
    MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh"
  runs+=("pruned-joint-l$lambda=$dir")
done

mkdir -p "$WORK_DIR/report"
for run in "${runs[@]}"; do
  name="${run%%=*}" dir="${run#*=}"
  bash "$HERE/evaluate.sh" "$name" "$dir/checkpoint_last.pt"
  study gate_trajectory "$dir" --scores "$scores/heads.json" \
    > "$WORK_DIR/report/trajectory-$(basename "$dir").txt"
done

if [[ -n "$CONTROLS" ]]; then
  for dir in "${encoder_runs[@]}"; do
    PRUNED="$dir/checkpoint_last.pt" CONTROLS="$CONTROLS" FT_EPOCHS="$PRUNE_EPOCHS" \
      CONTROL_CHECKPOINT="$CONTROL_CHECKPOINT" \
      SCRATCH_EPOCHS="$BASELINE_EPOCHS" SCORE_SENTENCES="$SCORE_SENTENCES" \
      bash "$HERE/controls.sh"
  done
fi

bash "$HERE/report.sh"  # evaluate.sh recorded each model's checkpoint
log "done: $WORK_DIR/report/report.md"
