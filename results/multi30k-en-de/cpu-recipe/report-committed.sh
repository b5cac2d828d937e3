#!/usr/bin/env bash
# A study's report from the files committed here, its run folder being gone:
# recipes/report.py over STUDY/eval/ (third-baseline: 4 heads, joint pruning, their controls;
# fourth-baseline: the same, every 4-head control) and STUDY/eval-last/ (the controls' last
# checkpoints, evaluated by hand: their model.json is the control's own, with "selected":
# "last"; where eval/ has the same name, run.sh's own evaluation, that one), and, as first-<name> (hollow markers, differences to first-baseline), the first
# baseline's evaluations in eval/ (10 heads and its controls), with STUDY's head scores and
# gate trajectories (model.json "run_dir"). The raw text (length buckets, paired tests) is
# RAW_DIR's: Multi30k as prepare.sh reads it (default ../shared/data/multi30k next to the
# repository, else WORK_DIR/raw of a prepared run folder). Writes STUDY/report/.
#   STUDY   [third-baseline], fourth-baseline, or the path of a folder laid out as they are
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
STUDY="${STUDY:-third-baseline}"
[[ $STUDY == /* ]] || STUDY="$HERE/$STUDY"
[[ -d $STUDY/eval ]] || { echo "error: no evaluations in $STUDY/eval" >&2; exit 1; }
RAW_DIR="${RAW_DIR:-$ROOT/../shared/data/multi30k}"
[[ -d $RAW_DIR ]] || RAW_DIR="${WORK_DIR:-$HOME/headprune-runs/multi30k-conv3}/raw"
[[ -f $RAW_DIR/test_2016_flickr.de ]] || { echo "error: no Multi30k raw text in $RAW_DIR (set RAW_DIR)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/eval"
for d in "$STUDY"/eval/*/; do ln -s "$d" "$work/eval/$(basename "$d")"; done
for d in "$HERE"/eval/*/; do ln -s "$d" "$work/eval/first-$(basename "$d")"; done
if [[ -d $STUDY/eval-last ]]; then
  "$ROOT/.venv/bin/python" - "$STUDY" "$work/eval" <<'PY'
import json, sys
from pathlib import Path

study, out = Path(sys.argv[1]), Path(sys.argv[2])
# a control's evaluations by the folder of its checkpoint (controls/<control>/)
records = {}
for f in sorted(study.glob("eval/*/model.json")):
    rec = json.loads(f.read_text())
    if rec.get("checkpoint"):
        records[str(Path(rec["checkpoint"]).parent)] = rec
for d in sorted(p for p in (study / "eval-last").iterdir() if p.is_dir()):
    if (out / d.name).exists():  # run.sh evaluated it itself (CONTROL_CHECKPOINT=both)
        continue
    ckpt = (d / "checkpoint").read_text().strip()
    rec = records.get(str(Path(ckpt).parent))
    if rec is None:
        sys.exit(f"error: no evaluation in {study}/eval of the run of {ckpt} ({d.name})")
    folder = out / d.name
    folder.mkdir()
    for f in d.iterdir():
        (folder / f.name).symlink_to(f.resolve())
    (folder / "model.json").write_text(json.dumps({**rec, "checkpoint": ckpt, "selected": "last"}))
PY
fi
"$ROOT/.venv/bin/python" "$ROOT/recipes/report.py" --work-dir "$work" --raw-dir "$RAW_DIR" \
  --scores "$STUDY/scores-baseline/heads.json" \
  --out-dir "$STUDY/report" "$@"
