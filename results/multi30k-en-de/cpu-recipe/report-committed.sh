#!/usr/bin/env bash
# The third baseline's report from the files committed here, its run folder being gone:
# recipes/report.py over third-baseline/eval/ (4 heads, joint pruning, their controls) and,
# as first-<name> (hollow markers, differences to first-baseline), the first baseline's
# evaluations in eval/ (10 heads and its controls), with the third baseline's head scores and
# gate trajectories (model.json "run_dir"). The raw text (length buckets, paired tests) is
# RAW_DIR's: Multi30k as prepare.sh reads it (default ../shared/data/multi30k next to the
# repository, else WORK_DIR/raw of a prepared run folder). Writes third-baseline/report/.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
RAW_DIR="${RAW_DIR:-$ROOT/../shared/data/multi30k}"
[[ -d $RAW_DIR ]] || RAW_DIR="${WORK_DIR:-$HOME/headprune-runs/multi30k-conv3}/raw"
[[ -f $RAW_DIR/test_2016_flickr.de ]] || { echo "error: no Multi30k raw text in $RAW_DIR (set RAW_DIR)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/eval"
for d in "$HERE"/third-baseline/eval/*/; do ln -s "$d" "$work/eval/$(basename "$d")"; done
for d in "$HERE"/eval/*/; do ln -s "$d" "$work/eval/first-$(basename "$d")"; done
"$ROOT/.venv/bin/python" "$ROOT/recipes/report.py" --work-dir "$work" --raw-dir "$RAW_DIR" \
  --scores "$HERE/third-baseline/scores-baseline/heads.json" \
  --out-dir "$HERE/third-baseline/report" "$@"
