#!/usr/bin/env bash
# Post-training pruning curve (Kwon et al. 2022): `fairseq-headprune prune` at each budget,
# no retraining, then BLEU (recipes/evaluate.sh) and speed (`fairseq-headprune bench`).
#
#   recipes/posttrain.sh BASELINE_CHECKPOINT
# Settings: BUDGETS ["macs:0.8 macs:0.6"], CALIBRATION [2000] sentences of the train subset,
# RUNS_DIR [$WORK_DIR/../posttrain] (one folder per budget: pruned.pt, prune.{log,json},
# bench.{log,json}), SUBSETS ["valid test"] for evaluate.sh, BENCH_BATCHES ["16 64"],
# BENCH_SENTENCES [256]. Evaluations are named posttrain-<kind><fraction> (posttrain-macs0.6).
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
BENCH_BATCHES="${BENCH_BATCHES:-16 64}"
BENCH_SENTENCES="${BENCH_SENTENCES:-256}"
export SUBSETS="${SUBSETS:-valid test}"

for budget in $BUDGETS; do
  tag="${budget//:/}"
  run="$RUNS_DIR/$tag"
  mkdir -p "$run"
  if [[ ! -s "$run/pruned.pt" ]]; then
    log "prune $budget"
    fairseq-headprune prune "$DATA_BIN" --path "$baseline" --budget "$budget" \
      --calibration-sentences "$CALIBRATION" --out "$run/pruned.pt" --force \
      --json-out "$run/prune.json" > "$run/prune.log" 2>&1
  fi
  grep -v '^INFO' "$run/prune.log" | sed "s/^/$tag: /"
  bash "$HERE/evaluate.sh" "posttrain-$tag" "$run/pruned.pt"
  if [[ ! -s "$run/bench.json" ]]; then
    log "bench $budget"
    # shellcheck disable=SC2086
    fairseq-headprune bench "$DATA_BIN" --full "$baseline" --pruned "$run/pruned.pt" \
      --batch-sizes $BENCH_BATCHES --max-sentences "$BENCH_SENTENCES" --repeats 2 \
      --json-out "$run/bench.json" > "$run/bench.log" 2>&1
  fi
  grep -v '^INFO' "$run/bench.log" | sed "s/^/$tag: /"
done
