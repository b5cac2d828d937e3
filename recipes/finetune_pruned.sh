#!/usr/bin/env bash
# Fine-tune a physically pruned model (the output of `fairseq-headprune export`) with the same
# budget as recipes/prune.sh: the controls of recipes/controls.sh (Voita et al. 2019).
#
#   recipes/finetune_pruned.sh RUN_DIR PRUNED_CKPT
# PRUNED_CKPT.heads.json (written by export) gives the shape: --arch gated_transformer
# --kept-heads PRUNED_CKPT.heads.json, the other model flags read from the checkpoint. Without
# it, PRUNED_CKPT is fine-tuned at its full size (the equally fine-tuned reference).
#
# Settings (environment variables, defaults in brackets; as in prune.sh):
#   MAX_EPOCH [10]   LR [5e-4] (fixed)   MAX_TOKENS [4096]   SEED [1]   EXTRA_ARGS (appended)
#   PATIENCE        stop after N epochs without a better validation nll (fairseq's
#                   --patience; the best checkpoint is kept) [0: run all MAX_EPOCH epochs]
#   FREEZE_DECODER  1: train the encoder only, as prune.sh does [1]. gated_transformer's
#                   --freeze-decoder needs enc-self gates, so the model gets them with
#                   --head-gate-init-log-alpha GATE_INIT [20]: a gate is then exactly 1 in
#                   evaluation and in every training sample (the noise u is clamped to
#                   >= 1e-6), and no penalty acts on it (stock label_smoothed_cross_entropy): the kept heads
#                   stay as they are (--head-gate-lr-scale 1: log α moves at most about
#                   lr per update). 0: --head-gates none, everything trains.
# Resumable: fairseq-train continues from RUN_DIR/checkpoint_last.pt, with PATIENCE one epoch
# at a time, stopping where an uninterrupted run would have (train_resumable in lib/common.sh);
# skipped when RUN_DIR/DONE exists.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
[[ $# -eq 2 ]] || die "usage: $0 RUN_DIR PRUNED_CKPT"
run="$1"; pruned="$2"
MAX_EPOCH="${MAX_EPOCH:-10}"
LR="${LR:-5e-4}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
FREEZE_DECODER="${FREEZE_DECODER:-1}"
GATE_INIT="${GATE_INIT:-20}"
SEED="${SEED:-1}"
PATIENCE="${PATIENCE:-0}"
EXTRA_ARGS="${EXTRA_ARGS:-}"

[[ -f "$pruned" ]] || die "no checkpoint at $pruned"
kept=()
[[ -f "$pruned.heads.json" ]] && kept=(--kept-heads "$pruned.heads.json")
if [[ -f "$run/DONE" ]]; then log "already fine-tuned: $run"; exit 0; fi
mkdir -p "$run"
gates=(--head-gates none)
[[ "$FREEZE_DECODER" == 1 ]] && gates=(--head-gates enc-self --head-gate-init-log-alpha "$GATE_INIT" --head-gate-lr-scale 1 --freeze-decoder)
# shellcheck disable=SC2207
model_flags=($(fairseq-headprune flags "$pruned"))
train() {  # MAX_EPOCH PATIENCE
  # shellcheck disable=SC2086
  fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --arch gated_transformer "${model_flags[@]}" "${kept[@]}" "${gates[@]}" \
    --finetune-from-model "$pruned" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr "$LR" --lr-scheduler fixed --weight-decay 0.0001 \
    --max-tokens "$MAX_TOKENS" --max-epoch "$1" --seed "$SEED" \
    --save-dir "$run" --no-epoch-checkpoints --best-checkpoint-metric nll_loss \
    --patience "$2" --log-format simple --log-interval 50 $EXTRA_ARGS 2>&1 \
    | tee -a "$run/train.log"
}
[[ -f "$run/checkpoint_last.pt" ]] || log "fine-tuning $pruned -> $run ($MAX_EPOCH epochs)"
train_resumable "$run" "$MAX_EPOCH" "$PATIENCE" train
touch "$run/DONE"
