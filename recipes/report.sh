#!/usr/bin/env bash
# The results table and plot of every evaluated model: recipes/study/report.py under the recipes'
# settings (WORK_DIR, the repository's virtual environment). Arguments go to it
# (--model NAME=CKPT, --plot-split SPLIT, --out-dir DIR). Writes $WORK_DIR/report/.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
export WORK_DIR SRC TGT
study report "$@"
