#!/usr/bin/env bash
# Create ./.venv and install fairseq-headprune with its dependencies (idempotent).
#
#   VENV         where to create the virtual environment (default: <repo>/.venv)
#   PYTHON       interpreter to build it from (default: python3; 3.10 or 3.11)
#   TORCH_SPEC   torch requirement installed first (default: torch==2.13.0). On a machine
#                without a local CPU wheel, point pip at PyTorch's CPU wheel index, e.g.
#                PIP_EXTRA_INDEX_URL=<pytorch cpu index>, or a plain PyPI torch is a CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip wheel setuptools
# torch first, pinned, so that no later step resolves a different (CUDA) build; cython and
# numpy too, which fairseq's extensions need at build time (without build isolation).
pip install "$TORCH_SPEC" cython numpy
# fairseq-fixed is an sdist: build it against the torch just installed (build isolation
# would download another torch).
"$VENV/bin/python" -c "import fairseq" 2>/dev/null || pip install --no-build-isolation fairseq-fixed==0.12.3.1
pip install -e "$ROOT[dev]"
"$VENV/bin/python" - <<'PY'
import torch, fairseq, fairseq_headprune
print(f"ok: torch {torch.__version__}, fairseq {fairseq.__version__}")
PY
