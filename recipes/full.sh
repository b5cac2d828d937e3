#!/usr/bin/env bash
# The whole study of Voita et al. 2019 on Multi30k in one command: prepare -> the baseline ->
# encoder-only pruning (λ sweep and exact budgets, decoder frozen) -> joint pruning of all
# three attention types (λ sweep and exact total budgets, decoder trained) -> phase 2 of the
# two-phase protocol -> the paper's controls at each encoder-only budget -> sacreBLEU of every
# model on validation and the three test sets -> report.
#
# The baseline is the committed one (models/multi30k-en-de/baseline.pt, with its
# SentencePiece model and dictionary) unless BASELINE names another checkpoint or
# TRAIN_BASELINE=1 trains a new one with recipes/train_baseline.sh.
#
# Two-phase protocol (PHASE2_EPOCHS > 0, the default): phase 1 trains the gates
# (recipes/prune.sh, PRUNE_EPOCHS); phase 2 fixes the structure they chose (export) and
# fine-tunes the physically smaller model without gates or penalty (recipes/finetune_pruned.sh)
# for up to PHASE2_EPOCHS epochs, stopping after PATIENCE epochs without a better validation
# nll, checkpoint by validation nll, once per seed in PHASE2_SEEDS. The controls get exactly
# that fine-tuning (same epochs, patience, checkpoint rule, the first seed of PHASE2_SEEDS)
# and are compared with that seed's phase 2 (controls.sh's PHASE2_OF). Evaluated as <run>-s<seed>
# (phase 2) and <run> (phase 1's last checkpoint: the one-phase model). PHASE2_EPOCHS=0 is
# the one-phase path (controls then fine-tuned PRUNE_EPOCHS epochs, CONTROL_CHECKPOINT).
#
# Each step is one of the other recipes (read their headers for the fairseq commands and
# their settings, which pass through); every step skips finished work, so rerunning the
# command continues an interrupted study. On 2 CPU cores a pruning run or a fine-tuning is
# 40-90 minutes and a from-scratch control hours; a GPU runs the same commands unchanged.
#
# Settings (environment variables, defaults in brackets):
#   BASELINE      the stock model pruned [models/multi30k-en-de/baseline.pt]
#   TRAIN_BASELINE  1: train a baseline (BASELINE_EPOCHS) in $WORK_DIR/baseline instead [0]
#   LAMBDAS       encoder-only --l0-lambda sweep (decoder frozen), 0 being the encoder-only
#                 control with every head kept: the fair reference of every encoder-only run
#                 (phase 1 and phase 2 with the same seed), given no controls of its own ["0"]
#   TARGETS       encoder-only --target-heads runs ["10 4"]
#   JOINT_LAMBDAS λ of joint runs (HEAD_GATES enc-self,dec-self,dec-enc, decoder trained),
#                 0 being the joint control with every head kept, the fair reference of
#                 every joint run's phase 2 with the same seed ["0"]
#   JOINT_TARGETS exact total budgets of joint runs, heads kept of 96 ["50 38 24 17": about
#                 48, 60, 75 and 82 % pruned]; an entry TYPE:K,... is one budget per
#                 attention type (enc-self:8,dec-self:7,dec-enc:9: run
#                 pruned-joint-k8-dec-self7-dec-enc9)
#   CONTROLS      controls.sh's controls at each encoder-only run's budget
#                 ["masked refit scratch random michel lrp"]; "" skips them
#   PRUNE_EPOCHS  phase 1 (gated) epochs [10]
#   PHASE2_EPOCHS [30]  PATIENCE [3]  PHASE2_SEEDS ["1 2 3"]
#   CONTROL_CHECKPOINT  with PHASE2_EPOCHS=0: the controls' checkpoints evaluated [both]
#   BASELINE_EPOCHS [55]  SCORE_SENTENCES valid sentences for head scores [2000, i.e. all]
#   JOBS          pruning runs (phase 1 and 2) trained side by side [1]; more only where the
#                 machine has the room (a GPU: 8 ran side by side at half their speed alone);
#                 each run's output then goes to $WORK_DIR/prune/<run>.log
# Outputs: $WORK_DIR/{prune,controls,eval,scores-baseline,report}.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
export WORK_DIR SRC TGT DATA_BIN

COMMITTED="$REPO_ROOT/models/multi30k-en-de"
TRAIN_BASELINE="${TRAIN_BASELINE:-0}"
LAMBDAS="${LAMBDAS-0}"
TARGETS="${TARGETS-10 4}"
JOINT_LAMBDAS="${JOINT_LAMBDAS-0}"
JOINT_TARGETS="${JOINT_TARGETS-50 38 24 17}"
CONTROLS="${CONTROLS-masked refit scratch random michel lrp}"
BASELINE_EPOCHS="${BASELINE_EPOCHS:-$BASELINE_EPOCHS_DEFAULT}"
PRUNE_EPOCHS="${PRUNE_EPOCHS:-10}"
PHASE2_EPOCHS="${PHASE2_EPOCHS:-30}"
PATIENCE="${PATIENCE:-3}"
PHASE2_SEEDS="${PHASE2_SEEDS:-1 2 3}"
CONTROL_CHECKPOINT="${CONTROL_CHECKPOINT:-both}"
SCORE_SENTENCES="${SCORE_SENTENCES:-2000}"
JOBS="${JOBS:-1}"
JOINT_GATES=enc-self,dec-self,dec-enc

if [[ "$TRAIN_BASELINE" == 1 ]]; then
  bash "$HERE/prepare.sh"
  MAX_EPOCH="$BASELINE_EPOCHS" PATIENCE=0 bash "$HERE/train_baseline.sh"  # not phase 2's
  BASELINE="$WORK_DIR/baseline/checkpoint_best.pt"
else
  BASELINE="${BASELINE:-$COMMITTED/baseline.pt}"
  [[ -f "$BASELINE" ]] || die "no baseline checkpoint at $BASELINE (or set TRAIN_BASELINE=1)"
  vocab="$(dirname "$BASELINE")"
  [[ -s "$vocab/spm.model" ]] || die "$vocab has no spm.model: the data must be encoded" \
    "with the baseline's own SentencePiece model and dictionary"
  VOCAB_FROM="$vocab" bash "$HERE/prepare.sh"
fi
export BASELINE
bash "$HERE/evaluate.sh" baseline "$BASELINE"

# The baseline's head scores: what the gate trajectories are correlated with.
scores="$WORK_DIR/scores-baseline"
[[ -s "$scores/heads.json" ]] || fairseq-headprune score "$DATA_BIN" --path "$BASELINE" \
  --subset valid --metrics lrp,confidence,entropy,positional,rare,importance \
  --max-sentences "$SCORE_SENTENCES" --out "$scores" --force

# Phase 1 (and phase 2) of every pruning run: NAME=DIR (encoder-only ones also get controls).
[[ "$PHASE2_EPOCHS" -gt 0 ]] || PATIENCE=0  # the one-phase path: as before, all epochs
export PHASE2_EPOCHS PHASE2_SEEDS PATIENCE  # phase 2 and the controls' fine-tuning alike
runs=() encoder_runs=()  # NAME=DIR of every pruning run, of the encoder-only ones
pids=()
prune() {  # NAME DIR [ENV=VALUE ...]: recipes/prune.sh with those settings, JOBS at a time
  local name="$1" dir="$2"; shift 2
  runs+=("$name=$dir")
  if [[ "$JOBS" -le 1 ]]; then
    env "$@" PRUNE_DIR="$dir" MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh"; return
  fi
  while [[ "$(jobs -rp | wc -l)" -ge "$JOBS" ]]; do wait -n || true; done
  mkdir -p "$dir"
  env "$@" PRUNE_DIR="$dir" MAX_EPOCH="$PRUNE_EPOCHS" bash "$HERE/prune.sh" \
    > "$dir.log" 2>&1 &
  pids+=($!)
}
for lambda in $LAMBDAS; do
  prune "pruned-l$lambda" "$WORK_DIR/prune/enc-self-l$lambda" LAMBDA="$lambda"
  [[ "$lambda" == 0 ]] || encoder_runs+=("${runs[-1]}")
done
for k in $TARGETS; do
  prune "pruned-k$k" "$WORK_DIR/prune/enc-self-k$k" TARGET_HEADS="$k"
  encoder_runs+=("${runs[-1]}")
done
for lambda in $JOINT_LAMBDAS; do
  prune "pruned-joint-l$lambda" "$WORK_DIR/prune/joint-l$lambda" LAMBDA="$lambda" \
    HEAD_GATES="$JOINT_GATES" FREEZE_DECODER=0
done
for k in $JOINT_TARGETS; do
  tag="k$k"  # per-type budgets: the tag of controls.sh's runs, e.g. k8-dec-self7-dec-enc9
  [[ "$k" == *:* ]] && tag="$(study controls budget --baseline "$BASELINE" --spec "$k" | sed -n 1p)"
  prune "pruned-joint-$tag" "$WORK_DIR/prune/joint-$tag" TARGET_HEADS="$k" \
    HEAD_GATES="$JOINT_GATES" FREEZE_DECODER=0
done
for pid in "${pids[@]}"; do  # a failed run stops the study, as it does without JOBS
  wait "$pid" || die "a pruning run failed: see $WORK_DIR/prune/*.log"
done

mkdir -p "$WORK_DIR/report"
for run in "${runs[@]}"; do
  name="${run%%=*}" dir="${run#*=}"
  # a run's fair reference: the λ = 0 control of its kind (joint or encoder-only), at the
  # end of phase 1 and of phase 2 with the same seed
  kind=pruned- lambdas="$LAMBDAS" control=""
  [[ "$name" == pruned-joint-* ]] && kind=pruned-joint- lambdas="$JOINT_LAMBDAS"
  [[ "$name" != "${kind}l0" && " $lambdas " == *" 0 "* ]] && control="${kind}l0"
  phase1=()  # a two-phase run's gated model is its phase 1, and its setting says so
  [[ "$PHASE2_EPOCHS" -gt 0 ]] && phase1=(--phase1-epochs "$PRUNE_EPOCHS")
  study controls record-gated --eval-dir "$WORK_DIR/eval/$name" \
    --checkpoint "$dir/checkpoint_last.pt" "${phase1[@]}" ${control:+--reference "$control"}
  bash "$HERE/evaluate.sh" "$name" "$dir/checkpoint_last.pt"
  if [[ "$PHASE2_EPOCHS" -gt 0 ]]; then
    for seed in $PHASE2_SEEDS; do
      reference=()
      [[ -n "$control" ]] && reference=(--reference "$control-s$seed")
      study controls record --eval-dir "$WORK_DIR/eval/$name-s$seed" \
        --method two-phase --checkpoint "$dir/phase2-s$seed/checkpoint_best.pt" \
        --kept "$dir/pruned.pt.heads.json" --seed "$seed" "${reference[@]}" \
        --phase2-of "$dir/checkpoint_last.pt" --run-dir "$dir/phase2-s$seed"
      bash "$HERE/evaluate.sh" "$name-s$seed" "$dir/phase2-s$seed/checkpoint_best.pt"
    done
  fi
  study gate_trajectory "$dir" --scores "$scores/heads.json" \
    > "$WORK_DIR/report/trajectory-$(basename "$dir").txt"
done

if [[ -n "$CONTROLS" ]]; then
  ft_epochs="$PRUNE_EPOCHS" checkpoint="$CONTROL_CHECKPOINT"
  [[ "$PHASE2_EPOCHS" -gt 0 ]] && ft_epochs="$PHASE2_EPOCHS" checkpoint=best
  for run in "${encoder_runs[@]}"; do
    # two-phase: fine-tuned like phase 2 with its first seed, which is their fair reference
    name="${run%%=*}" dir="${run#*=}" seed="${PHASE2_SEEDS%% *}" phase2_of=""
    [[ "$PHASE2_EPOCHS" -gt 0 ]] && phase2_of="$name-s$seed"
    PRUNED="$dir/checkpoint_last.pt" CONTROLS="$CONTROLS" FT_EPOCHS="$ft_epochs" \
      CONTROL_CHECKPOINT="$checkpoint" SCORE_SENTENCES="$SCORE_SENTENCES" SEED="$seed" \
      PHASE2_OF="$phase2_of" bash "$HERE/controls.sh"
  done
fi

bash "$HERE/report.sh"  # evaluate.sh recorded each model's checkpoint
log "done: $WORK_DIR/report/report.md"
