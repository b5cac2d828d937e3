# Shared settings and helpers for the recipes (sourced, not run).
# shellcheck shell=bash
WORK_DIR="${WORK_DIR:-$HOME/headprune-runs/multi30k}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
DATA_BIN="${DATA_BIN:-$WORK_DIR/data-bin}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
USER_DIR="${USER_DIR:-$REPO_ROOT/fairseq_headprune}"
# Epochs of the stock baseline (and of the from-scratch control when no baseline run folder
# tells controls.sh how far the baseline trained): where the post-norm baseline's validation
# BLEU stopped rising on Multi30k; the pre-norm default's validation BLEU was 40.0-40.6 from
# epoch 40 on.
BASELINE_EPOCHS_DEFAULT=55

# study MODULE ARGS: the study's Python, the package recipes/study/ (python -m recipes.study.MODULE)
study() {
  local module="$1"
  shift
  PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" python -m "recipes.study.$module" "$@"
}
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }
# take N: the first N lines of stdin, or all of them when N is 0
take() { if [[ "$1" -gt 0 ]]; then head -n "$1"; else cat; fi; }
# prune_tag: the pruning budget as it appears in run names: k<TARGET_HEADS> (commas become +,
# colons go) when TARGET_HEADS is set, else l<LAMBDA>. prune.sh's default PRUNE_DIR and the
# quickstart's run name both come from it.
prune_tag() {
  local tag
  if [[ -n "${TARGET_HEADS:-}" ]]; then
    tag="k${TARGET_HEADS//:/}"
    echo "${tag//,/+}"
  else
    echo "l$LAMBDA"
  fi
}

# train_resumable RUN MAX_EPOCH PATIENCE TRAIN_FN: `TRAIN_FN MAX_EPOCH PATIENCE` runs fairseq-train
# (--save-dir RUN, --max-epoch, --patience) once. A run interrupted before (RUN/checkpoint_last.pt)
# resumes: with PATIENCE 0 in one call; else one epoch at a time (`TRAIN_FN EPOCH 0`), stopping
# where an uninterrupted run with PATIENCE would have, since fairseq does not keep its patience
# counter in the checkpoint (recipes/study/epochs_trained.py).
train_resumable() {
  local run="$1" max_epoch="$2" patience="$3" train_fn="$4" next
  if [[ ! -f "$run/checkpoint_last.pt" || "$patience" -eq 0 ]]; then
    "$train_fn" "$max_epoch" "$patience"
    return
  fi
  while :; do
    next="$(study epochs_trained --next-epoch "$run" --patience "$patience" \
      --max-epoch "$max_epoch")"
    [[ "$next" -gt 0 ]] || break
    log "resuming $run: epoch $next of at most $max_epoch (patience $patience)"
    "$train_fn" "$next" 0
  done
}

# Use the repository's virtual environment when fairseq is not on PATH already.
if ! command -v fairseq-train >/dev/null 2>&1 && [[ -x "$REPO_ROOT/.venv/bin/fairseq-train" ]]; then
  export PATH="$REPO_ROOT/.venv/bin:$PATH"
fi
command -v fairseq-train >/dev/null 2>&1 || die "fairseq is not installed: run scripts/setup.sh"
