#!/usr/bin/env bash
# Install autotune into ./.venv (created if missing). Used by quickstart.sh and
# test.sh; EXTRAS="[test]" adds the test tools. pip's output goes to
# .venv/install.log and is shown only if the install fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
log=.venv/install.log
pip() {
    .venv/bin/python -m pip "$@" >>"$log" 2>&1 || { tail -40 "$log" >&2; echo "install failed (log: $log)" >&2; exit 1; }
}
: >"$log"
echo "installing into .venv (first time: about 4 minutes; log: $log)"
pip install --upgrade pip
# torch first, pinned to the release this machine has on disk (a CUDA build that
# also runs on CPU); the project's range admits 2.11 (the GPU machines) too
.venv/bin/python -c "import torch, torchvision" 2>/dev/null || pip install "torch==2.14.1" "torchvision==0.29.1"
pip install -e ".${EXTRAS:-}"
.venv/bin/python -c "import autotune, torch, ray, optuna, mlflow"
