#!/usr/bin/env bash
# Install with the test tools, then run the test suite (CPU; real Ray, MLflow, Optuna).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRAS="[test]" bash scripts/install.sh
.venv/bin/ruff check . && .venv/bin/ruff format --check . >/dev/null || { echo "ruff: run .venv/bin/ruff format . (and fix what ruff check names)" >&2; exit 1; }
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit "$rc"
