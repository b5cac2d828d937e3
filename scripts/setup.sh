#!/usr/bin/env bash
# Create ./.venv and install fairseq-headprune with its dependencies (idempotent).
#
#   VENV         where to create the virtual environment (default: <repo>/.venv)
#   PYTHON       interpreter to build it from (default: python3; 3.10 or 3.11)
#   CONSTRAINTS  the exact versions to install (default: <repo>/constraints.txt, the CPU
#                environment the tests run in; empty: the newest within setup.py's ranges)
#   TORCH_SPEC   torch requirement installed first (default: torch, at the constrained
#                version). On a machine without a local CPU wheel, point pip at PyTorch's CPU
#                wheel index, e.g. PIP_EXTRA_INDEX_URL=<pytorch cpu index>, or a plain PyPI
#                torch is a CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
CONSTRAINTS="${CONSTRAINTS-$ROOT/constraints.txt}"
TORCH_SPEC="${TORCH_SPEC:-torch}"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
pins=()
[[ -n "$CONSTRAINTS" ]] && pins=(-c "$CONSTRAINTS")
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip wheel setuptools
# torch first, so that no later step resolves a different (CUDA) build; cython and numpy
# too, which fairseq's extensions need at build time (without build isolation).
pip install "${pins[@]}" "$TORCH_SPEC" cython numpy
# fairseq-fixed is an sdist: build it against the torch just installed (build isolation
# would download another torch). An installed fairseq 0.12 is kept.
"$VENV/bin/python" -c "import fairseq" 2>/dev/null ||
  pip install "${pins[@]}" --no-build-isolation "fairseq-fixed>=0.12,<0.13"
pip install "${pins[@]}" -e "$ROOT[dev,analysis]"
"$VENV/bin/python" - <<'PY'
import torch, fairseq, fairseq_headprune
print(f"ok: torch {torch.__version__}, fairseq {fairseq.__version__}")
PY
