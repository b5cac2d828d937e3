#!/usr/bin/env bash
# Copy the study's small outputs (never checkpoints) from its run folder into OUT:
# the baselines' epoch lines, every evaluation's JSONs and hypotheses, the head scores (and the
# syntactic ones on UD English EWT), each finished pruning run's log (timestamped lines only),
# gate table and gate trajectory (table and the criterion's JSONL), each control's masks and
# log, and the report. Safe to rerun at any point of run.sh.
set -euo pipefail
shopt -s nullglob
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$HERE/../../../.venv/bin:$PATH"
# The first baseline's files stay where they are, in this folder (and new runs made on it,
# run.sh's first-<name>, come back here). The second baseline (seventeenth session) was lost
# with its machine after 32 epochs; its epoch lines are in second-baseline/. From the
# eighteenth session on, the baseline that run.sh trains in multi30k-conv2 is the third run of
# the recipe, and its study goes to third-baseline/; from the twenty-sixth session on, the
# fourth run's (multi30k-conv3) to fourth-baseline/.
W="${WORK_DIR:-$HOME/headprune-runs/multi30k-conv3}"
case $(basename "$W") in
  multi30k-conv2) default_out=$HERE/third-baseline ;;
  *) default_out=$HERE/fourth-baseline ;;
esac
OUT="${OUT:-$default_out}"
mkdir -p "$OUT"
stamped() { grep -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} ' "$1" | grep -v 'fairseq_cli.train | {' || true; }

for d in "$W"/baseline*/; do  # baseline (post-norm), baseline-prenorm (tenth session on)
  [[ -f $d/train.log ]] || continue
  grep -E 'Loaded checkpoint|\| (valid|train) \| epoch' "$d/train.log" \
    > "$OUT/$(basename "$d")-train-epochs.log" || true
done
for d in "$W"/eval/*/; do  # hypotheses too (seventeenth session on): the paired bootstrap
  # tests and length buckets need them, and a new machine loses the run folder
  name=$(basename "$d"); o="$OUT/eval/$name"
  if [[ $name == first-* ]]; then  # new runs on the first baseline go back to this
    # folder's eval/; run.sh's copies of it (no hypotheses, which were lost) are skipped
    [[ -n $(compgen -G "$d/*.hyp") ]] || continue
    o="$HERE/eval/${name#first-}"
  fi
  mkdir -p "$o"; cp "$d"/*.json "$d"/*.hyp "$o"/
  # the baseline's and pruning runs' evaluations have no model.json (controls.sh writes one):
  # record what the report reads from their checkpoint, which a new machine loses
  ckpt=$(cat "$d/checkpoint" 2>/dev/null || true)
  if [[ ! -f $d/model.json && -f $ckpt && $o == "$OUT"/* ]]; then
    python - "$ckpt" "$o/model.json" "$HERE/../../../recipes" <<'PY'
import json, sys
from pathlib import Path
ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from report import checkpoint_info
info = checkpoint_info(ckpt)
record = {k: info[k] for k in ("method", "setting", "heads", "gated")}
record.update(checkpoint=str(ckpt), kept_heads=info["kept"])
run = ckpt.parent
if run.parent.name == "prune":  # collect.sh copies its gate trajectory to prune/<run>/
    record["run_dir"] = f"../../prune/{run.name}"
elif (run / "train.log").is_file():  # a baseline: its epoch lines, <folder>-train-epochs.log
    record["train_log"] = f"../../{run.name}-train-epochs.log"
out.write_text(json.dumps(record, indent=1) + "\n")
PY
  fi
done
# the controls' last checkpoints, evaluated by hand beside run.sh (which evaluated only their
# best until the twenty-ninth session; it now evaluates both, as eval/<control>-last):
# WORK_DIR=$W/eval-last-work DATA_BIN=$W/data-bin SUBSETS="valid test test1 test2"
#   recipes/evaluate.sh <control>-last $W/controls/<control>/checkpoint_last.pt
# (with $W/eval-last-work/raw -> $W/raw), kept apart from eval/ (they have no model.json;
# report-committed.sh gives them their control's); one that run.sh evaluated too (the same
# checkpoint, the same hypotheses) is left to eval/, with run.sh's record
for d in "$W"/eval-last-work/eval/*/; do
  [[ -d $W/eval/$(basename "$d") ]] && continue
  o="$OUT/eval-last/$(basename "$d")"; mkdir -p "$o"
  cp "$d"/*.json "$d"/*.hyp "$d"/checkpoint "$o"/
done
if [[ -s $W/scores-baseline/heads.json ]]; then
  mkdir -p "$OUT/scores-baseline"
  cp "$W"/scores-baseline/{summary.md,heads.json,heads.csv} "$OUT/scores-baseline/"
fi
syntax=$W/syntax/en_ewt-ud-test/scores  # score_syntax.sh on the baseline
if [[ -s $syntax/heads.json ]]; then
  mkdir -p "$OUT/syntax-ud-ewt"
  cp "$syntax"/{summary.md,heads.json,heads.csv} "$syntax"/*.png "$OUT/syntax-ud-ewt/"
fi
for d in "$W"/prune/*/; do
  [[ -f $d/DONE ]] || continue
  o="$OUT/prune/$(basename "$d")"; mkdir -p "$o"
  stamped "$d/train.log" > "$o/train.log"
  fairseq-headprune gates "$d/checkpoint_last.pt" > "$o/gates.txt"
  for f in trajectory.txt gate_trajectory.jsonl export.txt pruned.pt.heads.json; do
    [[ -f $d/$f ]] && cp "$d/$f" "$o/"
  done
done
for d in "$W"/controls/*/; do
  name=$(basename "$d"); o="$OUT/controls/$name"
  [[ $name == first-* ]] && o="$HERE/controls/${name#first-}"
  mkdir -p "$o"
  for f in mask.json mask.json.steps.json pruned.pt.heads.json kept_heads.json; do
    [[ -f $d/$f ]] && cp "$d/$f" "$o/"
  done
  [[ -f $d/train.log ]] && stamped "$d/train.log" > "$o/train.log"
  rmdir --ignore-fail-on-non-empty "$o"  # folders with none of these (scores, structures)
done
if [[ -d $W/bench ]]; then  # run.sh's bench: full vs pruned model, side by side
  mkdir -p "$OUT/bench"
  for f in "$W"/bench/*.txt "$W"/bench/*.json; do cp "$f" "$OUT/bench/"; done
fi
if [[ -d $W/report ]]; then
  mkdir -p "$OUT/report"; cp "$W"/report/*.{md,png,txt,json} "$OUT/report/"
fi
