#!/usr/bin/env bash
# Post-training pruning curve (Kwon et al. 2022): `fairseq-headprune prune` at each budget,
# no retraining, then BLEU (recipes/evaluate.sh) and speed (`fairseq-headprune bench`).
#
#   recipes/posttrain.sh BASELINE_CHECKPOINT
# Settings: BUDGETS ["macs:0.8 macs:0.6"], CALIBRATION [2000] sentences of the train subset,
# RUNS_DIR [$WORK_DIR/../posttrain] (one folder per budget: pruned.pt, prune.{log,json},
# bench.{log,json}), SUBSETS ["valid test"] for evaluate.sh, BENCH_BATCHES ["16 64"; empty:
# no bench],
# BENCH_SENTENCES [256]. Evaluations are named posttrain-<kind><fraction> (posttrain-macs0.6),
# each with its model.json (python -m recipes.study.posttrain record).
#   FT_EPOCHS [0]  >0: fine-tune each pruned model that many epochs (recipes/finetune_pruned.sh,
#                  everything trainable, LR [3e-4: the baseline's last learning rate], SEED [1])
#                  into <run>/ft-s<SEED>, evaluated and benched (its own output lengths) as
#                  posttrain+ft-<tag>-s<SEED>; the baseline is fine-tuned the same way
#                  ($RUNS_DIR/full-ft<FT_EPOCHS>-s<SEED>, evaluated as
#                  finetuned-<FT_EPOCHS>ep-s<SEED>),
#                  the fine-tuned models' fair reference.
#   PRUNE_ARGS     more flags of `fairseq-headprune prune` (e.g. --rearrange --tune masks),
#                  with VARIANT a name for them appended to the tag (posttrain-heads24-kwon)
#                  [none]
#   SITES          prune only these attention types / FFN kinds (prune --sites, e.g. enc-self;
#                  the evaluation is named posttrain-<budget>-<sites>) [all]
#   MICHEL         1: for each budget, also Michel et al. 2019's iterative importance pruning
#                  of the baseline with the same heads per attention type, no retraining and
#                  no tuning (recipes.study.controls michel on CALIBRATION train sentences,
#                  then export --mask), evaluated as michel-<tag> [0]
#   FT_FREEZE_DECODER  1: fine-tune as prune.sh's gated runs do (the encoder only, LR [5e-4],
#                  the last checkpoint evaluated), the equal training budget of a gated model
#                  at the same heads; the reference is then finetuned-<N>ep-enc-s<SEED> [0]
#   RESULTS        a study folder in results/ (results/multi30k-en-de/study): copy every
#                  evaluation and run record there (python -m recipes.study.publish) [unset]
# Every step is skipped when its output exists, so the curve resumes where it stopped.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
[[ $# -eq 1 ]] || die "usage: $0 BASELINE_CHECKPOINT"
baseline="$1"
[[ -f "$baseline" ]] || die "no checkpoint at $baseline"
BUDGETS="${BUDGETS:-macs:0.8 macs:0.6}"
CALIBRATION="${CALIBRATION:-2000}"
RUNS_DIR="${RUNS_DIR:-$WORK_DIR/../posttrain}"
BENCH_BATCHES="${BENCH_BATCHES-16 64}"
BENCH_SENTENCES="${BENCH_SENTENCES:-256}"
export SUBSETS="${SUBSETS:-valid test}"
FT_EPOCHS="${FT_EPOCHS:-0}"
SEED="${SEED:-1}"
RESULTS="${RESULTS:-}"
SITES="${SITES:-}"
PRUNE_ARGS="${PRUNE_ARGS:-}"
VARIANT="${VARIANT:-}"
[[ -z "$PRUNE_ARGS" || -n "$VARIANT" ]] || die "PRUNE_ARGS needs a VARIANT name for its runs"
FT_FREEZE_DECODER="${FT_FREEZE_DECODER:-0}"
if [[ "$FT_FREEZE_DECODER" == 1 ]]; then
  LR="${LR:-5e-4}" ft_checkpoint=checkpoint_last.pt ft_tag="enc-"
else
  LR="${LR:-3e-4}" ft_checkpoint=checkpoint_best.pt ft_tag=""
fi
MICHEL="${MICHEL:-0}"
evals=()

# bench CHECKPOINT FOLDER: speed against the full model, side by side (FOLDER/bench.{json,log})
bench() {
  [[ -n "$BENCH_BATCHES" ]] || return 0
  if [[ ! -s "$2/bench.json" ]]; then
    log "bench $1"
    # shellcheck disable=SC2086
    fairseq-headprune bench "$DATA_BIN" --full "$baseline" --pruned "$1" \
      --batch-sizes $BENCH_BATCHES --max-sentences "$BENCH_SENTENCES" --repeats 2 \
      --json-out "$2/bench.json" > "$2/bench.log" 2>&1
  fi
  grep -v '^INFO' "$2/bench.log" | sed "s|^|$(basename "$2"): |"
}

# finetune NAME RUN CHECKPOINT: fine-tune FT_EPOCHS epochs, then evaluate
finetune() {
  local name="$1" run="$2" ckpt="$3"
  MAX_EPOCH="$FT_EPOCHS" LR="$LR" SEED="$SEED" FREEZE_DECODER="$FT_FREEZE_DECODER" \
    bash "$HERE/finetune_pruned.sh" "$run" "$ckpt"
  bash "$HERE/evaluate.sh" "$name" "$run/$ft_checkpoint"
  evals+=("$WORK_DIR/eval/$name")
}

reference="finetuned-${FT_EPOCHS}ep-${ft_tag}s$SEED"
full_ft="$RUNS_DIR/full-ft$FT_EPOCHS-${ft_tag}s$SEED"
if [[ "$FT_EPOCHS" -gt 0 ]]; then
  finetune "$reference" "$full_ft" "$baseline"
  study posttrain reference --eval-dir "$WORK_DIR/eval/$reference" --seed "$SEED" \
    --checkpoint "$full_ft/$ft_checkpoint" \
    --setting "fine-tuned $FT_EPOCHS epochs${ft_tag:+, encoder only}"
fi

# michel TAG RUN: Michel et al.'s heads at the pruned model's counts per attention type
michel() {
  local name="michel-$1" dir="$2/michel" budget
  mkdir -p "$dir"
  budget="$(study controls budget --baseline "$baseline" --kept "$2/pruned.pt.heads.json" \
    | tail -n 1)"
  [[ -s "$dir/mask.json" ]] || study controls michel --data "$DATA_BIN" --path "$baseline" \
    --budget "$budget" --subset train --max-sentences "$CALIBRATION" --out "$dir/mask.json"
  [[ -s "$dir/pruned.pt" ]] || fairseq-headprune export --path "$baseline" \
    --mask "$dir/mask.json" --out "$dir/pruned.pt" --force > "$dir/export.log"
  bash "$HERE/evaluate.sh" "$name" "$dir/pruned.pt"
  bench "$dir/pruned.pt" "$dir"
  study controls record --eval-dir "$WORK_DIR/eval/$name" --method michel \
    --checkpoint "$dir/pruned.pt" --kept "$dir/pruned.pt.heads.json" --setting "no retraining"
  evals+=("$WORK_DIR/eval/$name")
  if [[ "$FT_EPOCHS" -gt 0 ]]; then
    name="michel+ft-$1-${ft_tag}s$SEED"
    finetune "$name" "$dir/ft-${ft_tag}s$SEED" "$dir/pruned.pt"
    study controls record --eval-dir "$WORK_DIR/eval/$name" --method michel --seed "$SEED" \
      --checkpoint "$dir/ft-${ft_tag}s$SEED/$ft_checkpoint" --kept "$dir/pruned.pt.heads.json" \
      --setting "$FT_EPOCHS epochs${ft_tag:+, encoder only}" --reference "$reference" \
      ${ft_tag:+--selected last}
  fi
}

for budget in $BUDGETS; do
  tag="${budget//:/}${SITES:+-${SITES//,/+}}${VARIANT:+-$VARIANT}"
  run="$RUNS_DIR/$tag"
  mkdir -p "$run"
  if [[ ! -s "$run/pruned.pt" ]]; then
    log "prune $budget${SITES:+ of $SITES}"
    # shellcheck disable=SC2086
    fairseq-headprune prune "$DATA_BIN" --path "$baseline" --budget "$budget" $PRUNE_ARGS \
      ${SITES:+--sites "$SITES"} --calibration-sentences "$CALIBRATION" \
      --out "$run/pruned.pt" --force --json-out "$run/prune.json" > "$run/prune.log" 2>&1
  fi
  grep -v '^INFO' "$run/prune.log" | sed "s/^/$tag: /"
  bash "$HERE/evaluate.sh" "posttrain-$tag" "$run/pruned.pt"
  bench "$run/pruned.pt" "$run"
  study posttrain record --eval-dir "$WORK_DIR/eval/posttrain-$tag" --run "$run"
  evals+=("$WORK_DIR/eval/posttrain-$tag")
  [[ "$MICHEL" != 1 ]] || michel "$tag" "$run"
  if [[ "$FT_EPOCHS" -gt 0 ]]; then
    name="posttrain+ft-$tag-${ft_tag}s$SEED"
    ft="$run/ft-${ft_tag}s$SEED"
    finetune "$name" "$ft" "$run/pruned.pt"
    bench "$ft/$ft_checkpoint" "$ft"
    study posttrain record --eval-dir "$WORK_DIR/eval/$name" --run "$run" \
      --bench "$ft/bench.json" --method posttrain+ft --seed "$SEED" \
      --after "$FT_EPOCHS epochs${ft_tag:+, encoder only}" \
      --checkpoint "$ft/$ft_checkpoint" --reference "$reference"
  fi
done
if [[ -n "$RESULTS" ]]; then
  study publish "$RESULTS" "${evals[@]}" --runs posttrain
fi
