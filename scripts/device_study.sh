#!/usr/bin/env bash
# Run part of the study (recipes/full.sh) on a lent GPU machine and bring the evidence back.
#
# The machine has Python 3.12 with torch but no fairseq and no network. Prepare here, once:
#   bash scripts/device_study.sh --prepare
# which writes, in folders git ignores (add `/.whl/` and `/.devdata/` to .git/info/exclude):
#   .whl/      fairseq-fixed 0.12.3.1's sdist and the cp312 wheels it imports (hydra-core,
#              omegaconf, antlr4 runtime, bitarray)
#   .devdata/  Multi30k's raw text (RAW_DIR of prepare.sh)
# Then on the device, with `.whl` and `.devdata` carried and $OUT set by the device tool:
#   DEADLINE=540 TARGETS="10" JOINT_TARGETS="" JOINT_LAMBDAS="" CONTROLS="" JOBS=8 \
#     bash scripts/device_study.sh
# It installs fairseq's Python code with its Cython extensions and libbleu (the torch C++ ones
# are not used by translation; about 15 s), runs recipes/full.sh unchanged (settings pass through) with
# the committed baseline until DEADLINE seconds, then packs what the report needs (eval/
# hypotheses, BLEU JSONs and records, gate trajectories, kept heads, training logs) into
# $OUT/study.tgz. A machine starts bare: plan runs that finish within one call.
# RECIPE=recipes/controls.sh (or any other recipe or script in the working tree) runs that
# instead, after recipes/prepare.sh with the committed baseline's vocabulary; BASELINE is the
# committed baseline unless set, e.g. the 10-head controls without a committed evaluation
# (LRP order, Michel et al. and random draw 1 have one) with the phase-2 budget:
#   RECIPE=recipes/controls.sh BUDGET=10 CONTROLS=random SEEDS="2 3" \
#     FT_EPOCHS=30 PATIENCE=3 CONTROL_CHECKPOINT=best PHASE2_OF=pruned-k10-s1 \
#     SUBSETS="valid test test1 test2" bash scripts/device_study.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAIRSEQ=fairseq_fixed-0.12.3.1
if [[ "${1:-}" == --prepare ]]; then
  set -e
  mkdir -p .whl .devdata/multi30k
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64)
  python3 -m pip download -q --no-deps "${plat[@]}" -d .whl hydra-core==1.3.2 \
    omegaconf==2.3.0 bitarray==3.12.3
  python3 -m pip download -q --no-deps -d /tmp/antlr-4.9.3 antlr4-python3-runtime==4.9.3
  python3 -m pip wheel -q --no-deps /tmp/antlr-4.9.3/antlr4* -w .whl
  url="$(curl -fsS https://pypi.org/simple/fairseq-fixed/ | grep -o "https://[^\"#]*$FAIRSEQ.tar.gz")"
  curl -fsSL "$url" -o ".whl/$FAIRSEQ.tar.gz"
  cp "$ROOT/../shared/data/multi30k/"*.{en,de} .devdata/multi30k/
  ls -la .whl .devdata/multi30k
  exit 0
fi

: "${OUT:?set OUT, the folder whose files come back}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
t0=$(date +%s)
el() { echo "[t+$(($(date +%s) - t0))s] $*" | tee -a "$OUT/device.log"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/fs && tar xzf ".whl/$FAIRSEQ.tar.gz" -C /tmp/fs
FS="/tmp/fs/$FAIRSEQ"
(cd "$FS" && python3 - > "$OUT/build.log" 2>&1 <<'PY'
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

names = ("data_utils_fast", "token_block_utils_fast")
exts = [Extension(f"fairseq.data.{n}", [f"fairseq/data/{n}.pyx"], language="c++",
                  include_dirs=[numpy.get_include()]) for n in names]
bleu = Extension("fairseq.libbleu", [f"fairseq/clib/libbleu/{f}.cpp" for f in ("libbleu", "module")])
setup(name="fairseq-ext", script_args=["build_ext", "--inplace"],
      ext_modules=cythonize(exts, language_level=3) + [bleu])
PY
) || { tail -20 "$OUT/build.log"; exit 1; }
export PYTHONPATH="/tmp/site:$FS:$ROOT" PATH="/tmp/bin:$PATH"
mkdir -p /tmp/bin
for t in train preprocess generate validate; do
  printf '#!/bin/sh\nexec python3 -c "import sys; from fairseq_cli.%s import cli_main; sys.argv[0] = \\"fairseq-%s\\"; cli_main()" "$@"\n' "$t" "$t" > "/tmp/bin/fairseq-$t"
done
printf '#!/bin/sh\nexec python3 -m fairseq_headprune.cli "$@"\n' > /tmp/bin/fairseq-headprune
command -v python >/dev/null || ln -s "$(command -v python3)" /tmp/bin/python
chmod +x /tmp/bin/*
el "fairseq ready: $(python3 -c 'import torch, fairseq; print(torch.__version__, fairseq.__version__, torch.cuda.is_available())' 2>/dev/null)"

export WORK_DIR=/tmp/runs/multi30k RAW_DIR="$ROOT/.devdata/multi30k"
RECIPE="${RECIPE:-recipes/full.sh}"
if [[ "$(basename "$RECIPE")" != full.sh ]]; then  # full.sh prepares the data itself
  export BASELINE="${BASELINE:-models/multi30k-en-de/baseline.pt}"
  VOCAB_FROM="$(dirname "$BASELINE")" bash recipes/prepare.sh > "$OUT/prepare.log" 2>&1 ||
    { tail -5 "$OUT/prepare.log"; exit 1; }
fi
log_file="$OUT/$(basename "$RECIPE" .sh).log"
timeout "$((${DEADLINE:-540} - $(date +%s) + t0))" bash "$RECIPE" > "$log_file" 2>&1
el "$RECIPE rc=$?"
(cd "$WORK_DIR" && find eval prune controls report scores-baseline \
  \( -name '*.hyp' -o -name '*.json' -o -name '*.jsonl' -o -name 'checkpoint' -o -name lenpen \
     -o -name 'train.log' -o -name '*.txt' -o -name '*.md' \) 2>/dev/null \
  | tar czf "$OUT/study.tgz" -T -)
el "packed: $(du -h "$OUT/study.tgz" | cut -f1)"
