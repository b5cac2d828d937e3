#!/usr/bin/env bash
# Device run (session 6): a longer baseline, then on the same GPU side by side: encoder-only
# pruning to 10 and 4 heads (--target-heads), the λ = 0 control, and the controls at 10 heads
# (random x3, Michel, LRP order). The recipes run unchanged; this file only installs fairseq,
# starts them in parallel with deadlines, and packs what comes back.
#
# As run (sixth session, one H200 lent for 15 minutes, from the repository root with the
# recipes of commit 518443c, then not yet committed): `OUT=<returned folder> BASE_EPOCHS=40
# BASE_END=355 END=550 bash run.sh`, with .whl/ (fairseq-fixed 0.12.3.1 sdist, its pure-Python
# dependencies as cp312 wheels) and .devdata/multi30k/ (prepare.sh's raw/, spm/, data-bin/)
# next to it. What happened: run.log and docs/results.md ("A second GPU loan").
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
t0=$(date +%s)
now() { echo $(($(date +%s) - t0)); }
left() { local n=$(($1 - $(now))); echo $((n > 1 ? n : 1)); }  # seconds until a deadline
el() { echo "[t+$(now)s] $*" | tee -a "$OUT/run.log"; }
END=${END:-525}             # training and evaluation stop here; post-processing and packing after
BASE_END=${BASE_END:-370}   # the baseline stops here at the latest
BASE_EPOCHS=${BASE_EPOCHS:-40}
PE=${PRUNE_EPOCHS:-10}
K_HI=${K_HI:-10} K_LO=${K_LO:-4}
SS=${SCORE_SENTENCES:-2000}
XA="--no-save-optimizer-state ${EXTRA_ARGS:-}"
if [[ ${SETUP:-1} == 1 ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  el "wheels installed"
  (cd /tmp && env -u CUDA_HOME MAX_JOBS=16 python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site "$OLDPWD/.whl/fairseq_fixed-0.12.3.1.tar.gz") > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  el "fairseq built"
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:/tmp/site/bin:$PATH
  mkdir -p /tmp/bin
  for t in train preprocess generate validate; do printf '#!/bin/sh\nexec python3 -c "import sys; from fairseq_cli.%s import cli_main; sys.argv[0]=\\"fairseq-%s\\"; cli_main()" "$@"\n' $t $t > /tmp/bin/fairseq-$t; chmod +x /tmp/bin/fairseq-$t; done
  printf '#!/bin/sh\nexec python3 -m fairseq_headprune.cli "$@"\n' > /tmp/bin/fairseq-headprune && chmod +x /tmp/bin/fairseq-headprune
  command -v python >/dev/null || ln -s "$(command -v python3)" /tmp/bin/python
  nvidia-smi -L; python3 -c "import torch, fairseq; print(torch.__version__, fairseq.__version__, torch.cuda.is_available())"
  export WORK_DIR=/tmp/runs/multi30k; mkdir -p $WORK_DIR; cp -r .devdata/multi30k/* $WORK_DIR/
fi
W=$WORK_DIR L=$W/logs
mkdir -p "$L" "$W/report"
export WORK_DIR BASELINE=$W/baseline/checkpoint_best.pt
bash recipes/prepare.sh > "$L/prepare.log" 2>&1 || { el "prepare failed"; tail -20 "$L/prepare.log"; }

el "baseline start ($BASE_EPOCHS epochs)"
MAX_EPOCH=$BASE_EPOCHS EXTRA_ARGS="$XA" timeout $(left $BASE_END) bash recipes/train_baseline.sh > "$L/baseline.log" 2>&1
el "baseline end rc=$?"
grep "valid on" "$L/baseline.log" | tail -3 | cut -c 60-200
[[ -f $BASELINE ]] || { el "no baseline checkpoint"; exit 1; }
split -b 15M "$BASELINE" "$OUT/baseline_best.pt.part-"
sha256sum "$BASELINE" | tee -a "$OUT/run.log"

# Each chain: recipe commands in order, under the common deadline.
chain() {  # NAME COMMANDS...
  local name=$1; shift
  (timeout $(left $END) bash -c "$*" > "$L/$name.log" 2>&1; el "$name rc=$?") &
}
export XA PE SS K_HI K_LO W
chain eval-baseline 'bash recipes/evaluate.sh baseline $BASELINE'
for k in $K_HI $K_LO; do
  chain prune-k$k "TARGET_HEADS=$k PRUNE_DIR=\$W/prune/enc-self-k$k MAX_EPOCH=\$PE EXTRA_ARGS=\"\$XA\" bash recipes/prune.sh && bash recipes/evaluate.sh pruned-k$k \$W/prune/enc-self-k$k/checkpoint_last.pt"
done
chain prune-l0 'LAMBDA=0 PRUNE_DIR=$W/prune/enc-self-l0 MAX_EPOCH=$PE EXTRA_ARGS="$XA" bash recipes/prune.sh && bash recipes/evaluate.sh pruned-l0 $W/prune/enc-self-l0/checkpoint_last.pt'
chain michel 'BUDGET=$K_HI CONTROLS=michel FT_EPOCHS=$PE SCORE_SENTENCES=$SS EXTRA_ARGS="$XA" bash recipes/controls.sh'
# random and LRP order need the baseline's LRP scores, computed once before they start
timeout $(left $END) fairseq-headprune score "$W/data-bin" --path "$BASELINE" --subset valid \
  --metrics lrp --max-sentences "$SS" --out "$W/controls/scores-baseline" --force > "$L/score-lrp.log" 2>&1
el "lrp scores rc=$?"
for s in 1 2 3; do
  chain random-s$s "BUDGET=\$K_HI CONTROLS=random SEEDS=$s FT_EPOCHS=\$PE EXTRA_ARGS=\"\$XA\" bash recipes/controls.sh"
done
chain lrp 'BUDGET=$K_HI CONTROLS=lrp FT_EPOCHS=$PE EXTRA_ARGS="$XA" bash recipes/controls.sh'
# the baseline's scores for the report (roles of the kept heads, gate-closing correlations)
chain score-full 'fairseq-headprune score $W/data-bin --path $BASELINE --subset valid --metrics lrp,confidence,entropy,positional,rare,importance --max-sentences $SS --out $W/scores-baseline --force'
wait
el "chains done"

# Post-processing (checkpoints stay here): gate trajectories, model.json, the report.
for d in "$W"/prune/*/; do
  d=${d%/}; n=$(basename "$d")
  [[ -f $d/checkpoint_last.pt ]] || continue
  fairseq-headprune gates "$d/checkpoint_last.pt" --json > "$d/gates.json" 2>/dev/null
  [[ -s $W/scores-baseline/heads.json ]] && python recipes/lib/gate_trajectory.py "$d" \
    --scores "$W/scores-baseline/heads.json" --metrics lrp,confidence > "$W/report/trajectory-$n.txt" 2>&1
done
el "trajectories"
# model.json for the pruning runs, so the report can be rebuilt where the checkpoints are not
python - "$W" > "$L/records.log" 2>&1 <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "recipes")
import report
for f in sorted(Path(sys.argv[1], "eval").glob("*/checkpoint")):
    rec = f.parent / "model.json"
    if rec.exists():
        continue
    ckpt = f.read_text().strip()
    info = report.checkpoint_info(Path(ckpt))
    keys = ("method", "setting", "heads", "gated")
    out = {**{k: info[k] for k in keys}, "checkpoint": ckpt, "kept_heads": info["kept"]}
    rec.write_text(json.dumps(out, indent=1) + "\n")
    print(f.parent.name, info["method"], info["setting"], info["heads"])
PY
el "records rc=$?"
scores=(); [[ -s $W/scores-baseline/heads.json ]] && scores=(--scores "$W/scores-baseline/heads.json")
timeout 40 python recipes/report.py --work-dir "$W" "${scores[@]}" > "$L/report.log" 2>&1
el "report rc=$?"
(cd "$W" && tar czf "$OUT/results.tgz" --exclude='*.pt' --exclude='*.gen' --exclude='*.bin' \
  --exclude='*.idx' --exclude='raw' --exclude='spm' --exclude='data-bin' --exclude='*.tmp' .)
el done
