#!/usr/bin/env bash
# The study on the longer baseline (H200 epochs 1-25, then CPU; baseline-long), most important first.
# Resumable: every recipe skips finished work, so rerun this after an interruption. One job at a time.
#   nohup /work/runs/queue9.sh > /work/logs/queue9.log 2>&1 &
set -euo pipefail
cd "${SNAP:-/work/snap7}"
source .venv/bin/activate
export OMP_NUM_THREADS=2
: "${SCRATCH_EPOCHS:?set SCRATCH_EPOCHS (the baseline epochs)}"
export WORK_DIR=$HOME/headprune-runs/multi30k-conv SRC=en TGT=de
export SUBSETS="valid test test1 test2"
OLD=$HOME/headprune-runs/multi30k
mkdir -p "$WORK_DIR"
for d in raw spm data-bin; do [[ -e $WORK_DIR/$d ]] || ln -s "$OLD/$d" "$WORK_DIR/$d"; done
[[ -e $WORK_DIR/baseline ]] || ln -s "$OLD/baseline-long" "$WORK_DIR/baseline"
[[ -f $WORK_DIR/baseline/DONE ]] || { echo "baseline-long not finished (no DONE)"; exit 1; }
B=$WORK_DIR/baseline/checkpoint_best.pt
bash recipes/evaluate.sh baseline "$B"
scores=$WORK_DIR/scores-baseline
[[ -s $scores/heads.json ]] || fairseq-headprune score "$WORK_DIR/data-bin" --path "$B" \
  --subset valid --metrics lrp,confidence,entropy,positional,rare,importance \
  --max-sentences 2000 --out "$scores" --force
run_prune() {  # NAME then prune.sh settings
  local name=$1; shift
  env "$@" BASELINE="$B" bash recipes/prune.sh
  local dir; dir=$(env "$@" bash -c 'echo $PRUNE_DIR')
  bash recipes/evaluate.sh "$name" "$dir/checkpoint_last.pt"
  python recipes/lib/gate_trajectory.py "$dir" --scores "$scores/heads.json" \
    --metrics lrp,confidence > "$dir/trajectory.txt" || true
}
P=$WORK_DIR/prune
ctl() { BASELINE="$B" PRUNED=$P/enc-self-k$1/checkpoint_last.pt CONTROLS="$2" SEEDS="1 2 3" bash recipes/controls.sh; }
run_prune pruned-k10 TARGET_HEADS=10 PRUNE_DIR=$P/enc-self-k10
run_prune pruned-l0 LAMBDA=0 PRUNE_DIR=$P/enc-self-l0
ctl 10 "masked random michel lrp refit"
run_prune pruned-k4 TARGET_HEADS=4 PRUNE_DIR=$P/enc-self-k4
ctl 4 "masked random michel lrp refit"
run_prune pruned-joint-l0.03 LAMBDA=0.03 HEAD_GATES=enc-self,dec-self,dec-enc FREEZE_DECODER=0 PRUNE_DIR=$P/joint-l0.03
for k in 10 4; do
  BASELINE="$B" PRUNED=$P/enc-self-k$k/checkpoint_last.pt CONTROLS="scratch" \
    SCRATCH_EPOCHS="$SCRATCH_EPOCHS" bash recipes/controls.sh
done
run_prune pruned-joint-l0 LAMBDA=0 HEAD_GATES=enc-self,dec-self,dec-enc FREEZE_DECODER=0 PRUNE_DIR=$P/joint-l0
bash recipes/report.sh
