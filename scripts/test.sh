#!/usr/bin/env bash
# Install with the test tools, then run the test suite (CPU; real Ray, MLflow, Optuna).
#     bash scripts/test.sh          # what CI runs: every test but those marked slow (13-15 min on 2 cores)
#     bash scripts/test.sh --all    # the slow end-to-end runs too (~35 min on 2 cores): before a release
# Further arguments go to pytest (bash scripts/test.sh tests/test_trial.py -k window).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRAS="[test]" bash scripts/install.sh
.venv/bin/ruff check . && .venv/bin/ruff format --check . >/dev/null || { echo "ruff: run .venv/bin/ruff format . (and fix what ruff check names)" >&2; exit 1; }
tier=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
    tier=()
    shift
fi
set +e
.venv/bin/python -m pytest "${tier[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit "$rc"
