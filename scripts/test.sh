#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint and run the test suite. Extra arguments go to pytest.
#   TEST_WORKERS  pytest-xdist worker processes [2]; each test file runs whole on one worker
#                 (--dist loadfile), so a module's fixtures are built once. 0 runs in-process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
VENV="${VENV:-$ROOT/.venv}"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/python" -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
