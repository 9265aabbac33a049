#!/usr/bin/env bash
# Install autotune into ./.venv (created if missing). Used by quickstart.sh and
# test.sh; EXTRAS="[test]" adds the test tools. pip's output goes to
# .venv/install.log and is shown only if the install fails. An install is
# remembered in .venv/installed (pyproject.toml's hash and the extras): run again
# with both unchanged, it checks the packages are there and returns (~0.1 s, not
# ~13 s of pip); autotune itself is installed editable, so your edits need nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
log=.venv/install.log
stamp=.venv/installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) ${EXTRAS:-}"
packages="import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('torch', 'torchvision', 'ray', 'optuna', 'mlflow')))"
# the same pyproject.toml with these extras (or, asking for none, with any) installed before, and still there
if [ -f "$stamp" ] && { grep -qxF "$want" "$stamp" || { [ -z "${EXTRAS:-}" ] && grep -q "^${want% } " "$stamp"; }; } \
    && [ -x .venv/bin/autotune ] && .venv/bin/python -c "$packages" 2>/dev/null; then
    echo "installed already (.venv; pyproject.toml unchanged; reinstall: rm $stamp)"
    exit 0
fi
pip() {
    .venv/bin/python -m pip "$@" >>"$log" 2>&1 || { tail -40 "$log" >&2; echo "install failed (log: $log)" >&2; exit 1; }
}
: >"$log"
# the whole install is ~7 GB on disk (measured on x86_64: 6,937 MB with uv's cache, of which torch's CUDA build
# and what it brings are 5,510 MB): said here in one line, not as "No space left on device" halfway through
# (a CI machine once had less)
if .venv/bin/python -c "import torch" 2>/dev/null; then need_mb=2000; else need_mb=7500; fi
free_mb=$(df -Pm .venv | awk 'NR == 2 {print $4}')
if [ "${free_mb:-0}" -lt "$need_mb" ]; then
    echo "install: ${free_mb} MB free on the disk holding $(pwd)/.venv, and the install needs about ${need_mb} MB: free some space and run again" >&2
    exit 2
fi
echo "installing into .venv (first time: about a minute; log: $log)"
# uv where it installs (~85 s here from a cold cache, bytecode compiled, against pip's 156 s: torch's CUDA build
# unpacks to ~5 GB), with pip's own configuration (pip.conf, PIP_* variables: indexes, find-links, constraints)
# handed over; pip otherwise
if .venv/bin/python -m pip install uv >>"$log" 2>&1; then
    eval "$(.venv/bin/python scripts/pip_to_uv.py)"
    # compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (this host), a process would
    # otherwise compile torch, Ray and MLflow from source at every start (the CI tier took ~1.7x as long)
    export UV_COMPILE_BYTECODE=1
    pip() {
        .venv/bin/python -m uv pip "$@" --python .venv/bin/python >>"$log" 2>&1 \
            || { tail -40 "$log" >&2; echo "install failed (log: $log)" >&2; exit 1; }
    }
else
    pip install --upgrade pip
fi
# torch first, pinned to the release this machine has on disk (a CUDA build that
# also runs on CPU); the project's range admits 2.11 (the GPU machines) too
.venv/bin/python -c "import torch, torchvision" 2>/dev/null || pip install "torch==2.14.1" "torchvision==0.29.1"
pip install -e ".${EXTRAS:-}"
.venv/bin/python -c "import autotune, torch, ray, optuna, mlflow"
echo "$want" >>"$stamp"
