#!/usr/bin/env bash
# Install, then run the quickstart search (tiny CNN, local Ray, local MLflow store).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
exec .venv/bin/autotune search search_spaces/examples/quickstart.yaml "$@"
