#!/usr/bin/env bash
# Step 2: train the stock fairseq transformer that is later pruned.
#
# 6 encoder layers x 8 heads (48 encoder heads, as in Voita et al. 2019), 3 decoder layers,
# 256-dim, joint embeddings, pre-norm layers (NORM below). About 5 minutes per Multi30k epoch
# on 2 CPU cores; the default 55 epochs is where the validation BLEU of the post-norm layout
# stopped rising; the pre-norm layout's validation BLEU was 40.0-40.6 from epoch 40 on.
# PATIENCE=N ends it once the validation nll has not improved for N epochs (fairseq's
# --patience); MAX_EPOCH=<the epoch reached> ends a run where it is.
#
# Settings (environment variables, defaults in brackets):
#   WORK_DIR [$HOME/headprune-runs/multi30k]   DATA_BIN [$WORK_DIR/data-bin]
#   BASELINE_DIR [$WORK_DIR/baseline]          MAX_EPOCH [55]   MAX_TOKENS [4096]   PATIENCE [0]
#   EMBED_DIM [256]  FFN_DIM [1024]  ENC_LAYERS [6]  DEC_LAYERS [3]  HEADS [8]
#   NORM [pre]: where each sublayer's LayerNorm sits. pre: before the sublayer, with a final
#   LayerNorm on the encoder and decoder outputs (--encoder-normalize-before
#   --decoder-normalize-before), the layout of Voita et al.'s Transformer; post: after the
#   residual sum (fairseq's default), which trained much more slowly on Multi30k here
#   EXTRA_ARGS: appended to fairseq-train (e.g. "--max-update 20" for a smoke run)
#   ARCH [transformer]   ARCH_ARGS: model flags given after the shape and dropout flags above
#   (a later flag wins), e.g. recipes/controls.sh's pruned structure trained from scratch:
#   ARCH=gated_transformer ARCH_ARGS="--kept-heads K.json --head-gates none"
# Resumable: fairseq-train continues from $BASELINE_DIR/checkpoint_last.pt (with PATIENCE one
# epoch at a time, so that it stops where an uninterrupted run would: train_resumable in
# lib/common.sh); the step is skipped when the run has finished (BASELINE_DIR/DONE).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"

BASELINE_DIR="${BASELINE_DIR:-$WORK_DIR/baseline}"
MAX_EPOCH="${MAX_EPOCH:-$BASELINE_EPOCHS_DEFAULT}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
EMBED_DIM="${EMBED_DIM:-256}"
FFN_DIM="${FFN_DIM:-1024}"
ENC_LAYERS="${ENC_LAYERS:-6}"
DEC_LAYERS="${DEC_LAYERS:-3}"
HEADS="${HEADS:-8}"
PATIENCE="${PATIENCE:-0}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
ARCH="${ARCH:-transformer}"
ARCH_ARGS="${ARCH_ARGS:-}"
NORM="${NORM:-pre}"
case "$NORM" in
  post) norm_flags="" ;;
  pre) norm_flags="--encoder-normalize-before --decoder-normalize-before" ;;
  *) die "NORM must be post or pre, not '$NORM'" ;;
esac

if [[ -f "$BASELINE_DIR/DONE" ]]; then
  log "baseline already trained: $BASELINE_DIR"; exit 0
fi
mkdir -p "$BASELINE_DIR"
log "training baseline -> $BASELINE_DIR (log: $BASELINE_DIR/train.log)"
train() {  # MAX_EPOCH PATIENCE
  # shellcheck disable=SC2086
  fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --arch "$ARCH" --share-all-embeddings \
    --encoder-layers "$ENC_LAYERS" --decoder-layers "$DEC_LAYERS" \
    --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS" \
    --encoder-embed-dim "$EMBED_DIM" --decoder-embed-dim "$EMBED_DIM" \
    --encoder-ffn-embed-dim "$FFN_DIM" --decoder-ffn-embed-dim "$FFN_DIM" \
    --dropout 0.3 --attention-dropout 0.1 $norm_flags $ARCH_ARGS --weight-decay 0.0001 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 500 --warmup-init-lr 1e-7 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens "$MAX_TOKENS" --max-epoch "$1" --seed 1 \
    --save-dir "$BASELINE_DIR" --no-epoch-checkpoints --best-checkpoint-metric nll_loss \
    --patience "$2" --log-format simple --log-interval 50 $EXTRA_ARGS 2>&1 \
    | tee -a "$BASELINE_DIR/train.log"
}
train_resumable "$BASELINE_DIR" "$MAX_EPOCH" "$PATIENCE" train
touch "$BASELINE_DIR/DONE"
