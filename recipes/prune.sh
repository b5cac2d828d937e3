#!/usr/bin/env bash
# Step 3: gated fine-tuning of the baseline with the L0 penalty (Voita et al. 2019).
#
# Settings (environment variables, defaults in brackets):
#   BASELINE     checkpoint to prune [$WORK_DIR/baseline/checkpoint_best.pt]
#   PRUNE_DIR    run folder [$WORK_DIR/prune/<HEAD_GATES>-l<LAMBDA>, or -k<K> with TARGET_HEADS]
#   LAMBDA       --l0-lambda [0.05]
#   TARGET_HEADS --target-heads K (or TYPE:K,...) instead of a λ: an exact head budget [unset]
#   TARGET_WARMUP --target-heads-warmup-updates [900]: longer than a gate needs to close,
#                (3.0 − (−2.4)) / (LR × GATE_LR_SCALE) = 540 updates at the defaults, or the
#                multipliers grow while the gates lag behind the target (10 epochs: 1,360)
#   HEAD_GATES   --head-gates [enc-self]
#   FREEZE_DECODER  1: --freeze-decoder, encoder-only pruning as in the paper [1]
#   MAX_EPOCH    fine-tuning epochs [10]      LR [5e-4]
#   GATE_LR_SCALE  --head-gate-lr-scale [20, the flag's default]: a gate closes in about
#                (3.0 − (−2.4)) / (LR × GATE_LR_SCALE) updates; fairseq-train stops at start-up
#                when the run cannot close a gate (fewer than half that many updates)
#   ALLOW_SLOW_GATES  1: --allow-slow-gates, train even so (smoke runs) [0]
#   FORCE_BUDGET 1: export with --force-budget when the gates do not decide the heads (the
#                K heads of highest P(open), or the open gates as they are); otherwise export
#                stops and names the undecided gates [0]
#   TRAJECTORY_INTERVAL  record every gate each N updates in $PRUNE_DIR/gate_trajectory.jsonl
#                (read by recipes/study/gate_trajectory.py; 0: off) [25]
#   SEED         --seed of the gated fine-tuning [1]
#   EXTRA_ARGS   appended to fairseq-train
#   PHASE2_EPOCHS  the two-phase protocol [0: off, the one-phase path]: after the gates
#                (phase 1), the exported model is fine-tuned without gates or penalty for this
#                many epochs by recipes/finetune_pruned.sh (the controls' fine-tuning, same
#                budget and checkpoint rule: the best by validation nll), in
#                $PRUNE_DIR/phase2-s<seed>, the decoder trainable when HEAD_GATES gates a
#                decoder attention type, frozen otherwise
#   PHASE2_SEEDS   fine-tuning seeds of phase 2, one run each ["1"]
#   PATIENCE       phase 2 stops after N epochs without a better validation nll [0: off]
# The pruned model is $PRUNE_DIR/checkpoint_last.pt, the end of the fine-tuning: fairseq's
# checkpoint_best.pt (lowest validation nll) can be from before the gates closed, when more
# heads were open, so it is not the pruned model. `fairseq-headprune export` then writes it
# with the closed heads physically removed, $PRUNE_DIR/pruned.pt (and pruned.pt.heads.json,
# the heads kept): the same translations, a smaller model (stock fairseq-generate loads it
# with --user-dir). The model flags are read back from the baseline checkpoint. Resumable:
# fairseq-train continues from $PRUNE_DIR/checkpoint_last.pt; the training is skipped when
# $PRUNE_DIR/DONE exists, the export when pruned.pt.heads.json does, each phase-2 run when its
# DONE does.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"

BASELINE="${BASELINE:-$WORK_DIR/baseline/checkpoint_best.pt}"
LAMBDA="${LAMBDA:-0.05}"
TARGET_HEADS="${TARGET_HEADS:-}"
TARGET_WARMUP="${TARGET_WARMUP:-900}"
HEAD_GATES="${HEAD_GATES:-enc-self}"
FREEZE_DECODER="${FREEZE_DECODER:-1}"
if [[ -n "$TARGET_HEADS" ]]; then
  budget=(--target-heads "$TARGET_HEADS" --target-heads-warmup-updates "$TARGET_WARMUP")
else
  budget=(--l0-lambda "$LAMBDA")
fi
PRUNE_DIR="${PRUNE_DIR:-$WORK_DIR/prune/${HEAD_GATES//,/+}-$(prune_tag)}"
TRAJECTORY_INTERVAL="${TRAJECTORY_INTERVAL:-25}"
MAX_EPOCH="${MAX_EPOCH:-10}"
LR="${LR:-5e-4}"
GATE_LR_SCALE="${GATE_LR_SCALE:-20}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
SEED="${SEED:-1}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
PHASE2_EPOCHS="${PHASE2_EPOCHS:-0}"
PHASE2_SEEDS="${PHASE2_SEEDS:-1}"

[[ -f "$BASELINE" ]] || die "no baseline checkpoint at $BASELINE (run recipes/train_baseline.sh)"
ALLOW_SLOW_GATES="${ALLOW_SLOW_GATES:-0}"
FORCE_BUDGET="${FORCE_BUDGET:-0}"
slow=(); [[ "$ALLOW_SLOW_GATES" == 1 ]] && slow=(--allow-slow-gates)
force_budget=(); [[ "$FORCE_BUDGET" == 1 ]] && force_budget=(--force-budget)
export_pruned() {
  [[ -s "$PRUNE_DIR/pruned.pt.heads.json" ]] && return
  fairseq-headprune export --path "$PRUNE_DIR/checkpoint_last.pt" --out "$PRUNE_DIR/pruned.pt" \
    --force "${force_budget[@]}" | tee "$PRUNE_DIR/export.txt"
  log "exported: $PRUNE_DIR/pruned.pt ($(du -h "$PRUNE_DIR/pruned.pt" | cut -f1); the gated" \
    "checkpoint_last.pt with its optimizer state: $(du -h "$PRUNE_DIR/checkpoint_last.pt" | cut -f1))"
}
# Phase 2: the structure fixed, trained without gates to its best validation nll.
phase2() {
  [[ "$PHASE2_EPOCHS" -gt 0 ]] || return 0
  local freeze=1 seed
  [[ "$HEAD_GATES" == *dec-* ]] && freeze=0
  for seed in $PHASE2_SEEDS; do
    MAX_EPOCH="$PHASE2_EPOCHS" SEED="$seed" FREEZE_DECODER="$freeze" LR="$LR" \
      PATIENCE="${PATIENCE:-0}" \
      bash "$HERE/finetune_pruned.sh" "$PRUNE_DIR/phase2-s$seed" "$PRUNE_DIR/pruned.pt"
  done
}
if [[ -f "$PRUNE_DIR/DONE" ]]; then
  log "already pruned: $PRUNE_DIR"; export_pruned; phase2; exit 0
fi
mkdir -p "$PRUNE_DIR"
freeze=(); [[ "$FREEZE_DECODER" == 1 ]] && freeze=(--freeze-decoder)
# shellcheck disable=SC2207
model_flags=($(fairseq-headprune flags "$BASELINE"))
log "pruning $BASELINE -> $PRUNE_DIR (${budget[*]}, gates=$HEAD_GATES)"
# shellcheck disable=SC2086
fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" \
  --task translation --source-lang "$SRC" --target-lang "$TGT" \
  --arch gated_transformer "${model_flags[@]}" \
  --finetune-from-model "$BASELINE" \
  --head-gates "$HEAD_GATES" "${freeze[@]}" --head-gate-lr-scale "$GATE_LR_SCALE" "${slow[@]}" \
  --criterion label_smoothed_cross_entropy_l0 --label-smoothing 0.1 "${budget[@]}" \
  --gate-trajectory-interval "$TRAJECTORY_INTERVAL" \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
  --lr "$LR" --lr-scheduler fixed --weight-decay 0.0001 \
  --max-tokens "$MAX_TOKENS" --max-epoch "$MAX_EPOCH" --seed "$SEED" \
  --save-dir "$PRUNE_DIR" --no-epoch-checkpoints --best-checkpoint-metric nll_loss \
  --log-format simple --log-interval 50 $EXTRA_ARGS 2>&1 | tee -a "$PRUNE_DIR/train.log"
fairseq-headprune gates "$PRUNE_DIR/checkpoint_last.pt" | tee "$PRUNE_DIR/gates.txt"
touch "$PRUNE_DIR/DONE"
export_pruned
phase2
