#!/usr/bin/env bash
# The controls of Voita et al. 2019 at the head budget of a pruned run: the same number of
# heads kept, chosen or trained another way, each fine-tuned (or trained) with the same budget
# as the pruned run, then evaluated with recipes/evaluate.sh.
#
# Settings (environment variables, defaults in brackets):
#   BASELINE     the converged stock model [$WORK_DIR/baseline/checkpoint_best.pt]
#   PRUNED       a pruned gated checkpoint (prune.sh's checkpoint_last.pt; its open heads are
#                exported) or an exported model (PRUNED.heads.json next to it). Required.
#                Its kept-head count per attention type is the budget: K encoder heads (and,
#                after joint pruning, the count of each other reduced type).
#   BUDGET       instead of PRUNED, the budget itself for the controls that need only a head
#                count (random, michel, lrp): K encoder heads, or TYPE:K,... (e.g.
#                enc-self:10,dec-enc:12). Lets them run before, or beside, the pruning run.
#   CONTROLS     ["masked refit scratch random michel lrp"; with BUDGET "random michel lrp"]
#   SEEDS        ["1 2 3"] (random: the draws)
#   SEED         the fine-tuning seed of every control [1]
#   FT_EPOCHS    fine-tuning epochs, = prune.sh's MAX_EPOCH [10] (refit, random, michel, lrp)
#   CONTROL_CHECKPOINT  the checkpoint of a fine-tuned control (refit, random, michel, lrp)
#                that is evaluated [best]: best (checkpoint_best.pt, by validation nll), last
#                (checkpoint_last.pt, the end of the fine-tuning: a pruning run's own rule, as
#                its best checkpoint can predate the closing of its gates; evaluated as
#                <name>-last) or both. scratch, like the baseline, is evaluated at its best.
#   PHASE2_OF    the evaluation NAME of a two-phase run's phase 2 (prune.sh with PHASE2_EPOCHS,
#                e.g. pruned-k4-s1) whose fine-tuning budget the controls are given (set
#                FT_EPOCHS, PATIENCE and CONTROL_CHECKPOINT=best as that run had them): their
#                records' setting is "phase-2 budget" and NAME their fair reference [none]
#   SCRATCH_EPOCHS  epochs of the from-scratch run [the baseline's: the epochs completed by
#                the checkpoint_last.pt next to BASELINE, else by BASELINE itself]
#   SCORE_SENTENCES valid sentences for the LRP and importance scores [2000, i.e. all]
#   MICHEL_STEP  heads removed per importance step [0: 10 % of the type's heads]
#   SUBSETS, BEAM, BATCH_SIZE: see evaluate.sh; MAX_TOKENS, EXTRA_ARGS: passed to
#   fairseq-train (train_baseline.sh, finetune_pruned.sh)
#
# Runs, each in $WORK_DIR/controls/<name>-<tag> (tag k<K>, e.g. k6) and evaluated as
# $WORK_DIR/eval/<name>-<tag>/ (with a model.json for recipes/report.sh):
#   masked       the pruned structure cut from the baseline's weights, not fine-tuned: what
#                fine-tuning after pruning buys (named masked-<pruned run>, as it is not
#                determined by the budget alone)
#   refit        the same structure cut from the baseline and fine-tuned like random, michel
#                and lrp: the pruned run's choice of heads with their training budget (a
#                pruning run trains its final heads only from the update its last gate
#                closed); named refit-<pruned run>
#   scratch      the pruned structure (kept-heads JSON) trained from scratch with the
#                baseline's recipe (train_baseline.sh, --arch gated_transformer --kept-heads
#                FILE --head-gates none, the baseline's model flags); named
#                scratch-<pruned run>, as masked, since two runs with the same head count
#                have different structures
#   random-s<S>  K encoder heads of the baseline at random (seed S), exported, fine-tuned
#   michel       Michel et al. 2019: iterative gradient-importance pruning of the baseline
#                (importance recomputed under the mask after each 10 % step), fine-tuned
#   lrp          the top K encoder heads of the baseline by LRP relevance, fine-tuned
# Fine-tuning (recipes/finetune_pruned.sh) is prune.sh's: Adam lr 5e-4 fixed, decoder frozen,
# FT_EPOCHS epochs, checkpoint by validation nll. Resumable: finished steps are skipped
# (DONE markers, existing outputs).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"

BASELINE="${BASELINE:-$WORK_DIR/baseline/checkpoint_best.pt}"
PRUNED="${PRUNED:-}"
BUDGET="${BUDGET:-}"
COUNT_CONTROLS="random michel lrp"  # the controls a head count suffices for (BUDGET)
if [[ -n "$BUDGET" ]]; then CONTROLS="${CONTROLS:-$COUNT_CONTROLS}"
else CONTROLS="${CONTROLS:-masked refit scratch random michel lrp}"; fi
SEEDS="${SEEDS:-1 2 3}"
FT_EPOCHS="${FT_EPOCHS:-10}"
SCRATCH_EPOCHS="${SCRATCH_EPOCHS:-}"
SCORE_SENTENCES="${SCORE_SENTENCES:-2000}"
MICHEL_STEP="${MICHEL_STEP:-0}"
CONTROL_CHECKPOINT="${CONTROL_CHECKPOINT:-best}"
PHASE2_OF="${PHASE2_OF:-}"
case "$CONTROL_CHECKPOINT" in
  best | last) selected=("$CONTROL_CHECKPOINT") ;;
  both) selected=(best last) ;;
  *) die "CONTROL_CHECKPOINT is best, last or both, not '$CONTROL_CHECKPOINT'" ;;
esac
ctl="$WORK_DIR/controls"

[[ -f "$BASELINE" ]] || die "no baseline checkpoint at $BASELINE"
[[ -z "$PRUNED" || -z "$BUDGET" ]] || die "set PRUNED or BUDGET, not both"
if [[ -n "$BUDGET" ]]; then
  for control in $CONTROLS; do
    [[ " $COUNT_CONTROLS " == *" $control "* ]] \
      || die "control '$control' needs the pruned run's heads: set PRUNED instead of BUDGET"
  done
fi
[[ -n "$BUDGET" || (-n "$PRUNED" && -f "$PRUNED") ]] \
  || die "set PRUNED to a pruned checkpoint (got '$PRUNED') or BUDGET to a head count"
mkdir -p "$ctl"

# The budget: the kept heads of the pruned model, or BUDGET.
if [[ -n "$BUDGET" ]]; then
  what=(--spec "$BUDGET") source_of_budget="BUDGET=$BUDGET"
else
  pruned_name="$(basename "$(dirname "$PRUNED")")-$(basename "$PRUNED" .pt)"
  if [[ -f "$PRUNED.heads.json" ]]; then
    structure="$PRUNED.heads.json"
    pruned_name="$(basename "$PRUNED" .pt)"
  else
    out="$ctl/structures/$pruned_name.pt"
    if [[ ! -f "$out.heads.json" ]]; then
      mkdir -p "$ctl/structures"
      fairseq-headprune export --path "$PRUNED" --out "$out" --force
    fi
    structure="$out.heads.json"
  fi
  what=(--kept "$structure") source_of_budget="$PRUNED"
fi
{ read -r tag; read -r budget; } < <(study controls budget --baseline "$BASELINE" "${what[@]}")
[[ -n "${budget:-}" ]] || die "could not read the head budget of $source_of_budget"
log "budget of $source_of_budget: $budget (runs: $ctl/*-$tag)"

evaluate() {  # NAME METHOD CKPT KEPT_JSON [SEED]; SELECTED=last: a checkpoint_last.pt
  local name="$1" method="$2" ckpt="$3" kept="$4" extra=()
  [[ $# -ge 5 ]] && extra+=(--seed "$5")
  [[ "${SELECTED:-}" == last ]] && extra+=(--selected last)
  [[ -n "$PHASE2_OF" ]] && extra+=(--phase2-budget-of "$PHASE2_OF")
  study controls record --eval-dir "$WORK_DIR/eval/$name" --method "$method" \
    --checkpoint "$ckpt" --kept "$kept" --run-dir "$(dirname "$ckpt")" "${extra[@]}"
  bash "$HERE/evaluate.sh" "$name" "$ckpt"
}

scores() {  # the baseline's LRP relevance (also the head list of random:SEED)
  local dir="$ctl/scores-baseline"
  [[ -s "$dir/heads.json" ]] || fairseq-headprune score "$DATA_BIN" --path "$BASELINE" \
    --subset valid --metrics lrp --max-sentences "$SCORE_SENTENCES" --out "$dir" --force >&2
  echo "$dir/heads.json"
}

prune_and_finetune() {  # NAME METHOD [SEED]: export $run/mask.json from the baseline, fine-tune
  local name="$1" run="$ctl/$1"
  [[ -s "$run/mask.json" ]] || die "internal: no mask for $name"
  [[ -f "$run/pruned.pt.heads.json" ]] || fairseq-headprune export --path "$BASELINE" \
    --mask "$run/mask.json" --out "$run/pruned.pt" --force
  MAX_EPOCH="$FT_EPOCHS" bash "$HERE/finetune_pruned.sh" "$run" "$run/pruned.pt"
  for which in "${selected[@]}"; do
    if [[ "$which" == best ]]; then
      evaluate "$name" "$2" "$run/checkpoint_best.pt" "$run/pruned.pt.heads.json" "${@:3}"
    else
      SELECTED=last evaluate "$name-last" "$2" "$run/checkpoint_last.pt" \
        "$run/pruned.pt.heads.json" "${@:3}"
    fi
  done
}

for control in $CONTROLS; do
  case "$control" in
    masked)
      run="$ctl/masked-$pruned_name"
      mkdir -p "$run"
      [[ -f "$run/pruned.pt.heads.json" ]] || fairseq-headprune export --path "$BASELINE" \
        --mask "$structure" --out "$run/pruned.pt" --force
      evaluate "masked-$pruned_name" masked "$run/pruned.pt" "$run/pruned.pt.heads.json"
      ;;
    refit)
      run="$ctl/refit-$pruned_name"
      mkdir -p "$run"
      [[ -s "$run/mask.json" ]] || cp "$structure" "$run/mask.json"
      prune_and_finetune "refit-$pruned_name" refit
      ;;
    scratch)
      run="$ctl/scratch-$pruned_name"
      mkdir -p "$run"
      if [[ -f "$run/kept_heads.json" ]] && ! cmp -s "$structure" "$run/kept_heads.json"; then
        die "$run was trained on another structure than $structure; move it away first"
      fi
      cp "$structure" "$run/kept_heads.json"
      # the baseline's own shape, dropout and norm flags (NORM=post adds no norm flag of its own)
      model_flags="$(fairseq-headprune flags "$BASELINE")"
      if [[ -z "$SCRATCH_EPOCHS" ]]; then  # as many epochs as the baseline's own run
        last="$(dirname "$BASELINE")/checkpoint_last.pt"
        if [[ -f "$last" ]]; then
          SCRATCH_EPOCHS="$(study epochs_trained "$last")"
          log "from scratch for $SCRATCH_EPOCHS epochs, as many as the baseline ($last)"
        else  # e.g. the committed baseline, saved without its run folder
          SCRATCH_EPOCHS="$(study epochs_trained "$BASELINE")"
          log "from scratch for $SCRATCH_EPOCHS epochs, as many as $BASELINE had trained"
        fi
      fi
      BASELINE_DIR="$run" MAX_EPOCH="$SCRATCH_EPOCHS" PATIENCE=0 ARCH=gated_transformer NORM=post \
        ARCH_ARGS="$model_flags --kept-heads $run/kept_heads.json --head-gates none" \
        bash "$HERE/train_baseline.sh"
      evaluate "scratch-$pruned_name" scratch "$run/checkpoint_best.pt" "$run/kept_heads.json"
      ;;
    random)
      for seed in $SEEDS; do
        run="$ctl/random-s$seed-$tag"
        mkdir -p "$run"
        [[ -s "$run/mask.json" ]] || study controls topk --scores "$(scores)" \
          --metric "random:$seed" --budget "$budget" --out "$run/mask.json"
        prune_and_finetune "random-s$seed-$tag" random "$seed"
      done
      ;;
    michel)
      run="$ctl/michel-$tag"
      mkdir -p "$run"
      [[ -s "$run/mask.json" ]] || study controls michel --data "$DATA_BIN" \
        --path "$BASELINE" --budget "$budget" --step "$MICHEL_STEP" \
        --max-sentences "$SCORE_SENTENCES" --out "$run/mask.json"
      prune_and_finetune "michel-$tag" michel
      ;;
    lrp)
      run="$ctl/lrp-$tag"
      mkdir -p "$run"
      [[ -s "$run/mask.json" ]] || study controls topk --scores "$(scores)" \
        --metric lrp --budget "$budget" --out "$run/mask.json"
      prune_and_finetune "lrp-$tag" lrp
      ;;
    *) die "unknown control '$control' (choose from: masked refit scratch random michel lrp)" ;;
  esac
done
log "controls done: $ctl/*-$tag; table: bash recipes/report.sh"
