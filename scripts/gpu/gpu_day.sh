#!/usr/bin/env bash
# One command makes a lent GPU count (issue 23): on one GPU, in priority order,
# each step under a time cap, each result written as it finishes to
# scripts/measurements/<gpu>-<date>/ (JSON/CSV and the step's log; a README there
# says what ran, with the commands and the commit):
#   1 fidelity   2 classic case   3 live search (15 min) + 3b classic --found
#   3c the language-model search (TRL's SFT script on a 134M Llama, 4 min; 12 with its
#      parity and re-measurement) + 3d its winner beside the hand-tuned recipe
#      (scripts/bench/bench_llm.py)
#   4 parity rows at 224 px   5 fused optimizers   6 first-step overhead
#   6b each language-model knob alone (bench_llm.py --parts knobs)
#   7 the realistic GPU landscape, with whatever time is left (appended point by point
#     to scripts/bench/landscapes/<gpu>_resnet18_gpunorm.csv, so the next GPU continues it)
# A failed step is recorded and the rest still run; a step with a result is skipped,
# so the day spans several 10-minute device commands. Total time: --budget-min
# (default 75). The steps' logic is in scripts/gpu/gpu_day.py.
#
# Here, before lending (downloads the wheels the GPU host lacks into .whl/, git-ignored):
#     bash scripts/gpu/gpu_day.sh --stage
#     bash scripts/gpu/gpu_day.sh --dry-run           # each step, its cap, command and files
# On the GPU, through the device tool (carry: [".whl"]); the first command starts the day
# detached (setsid: it outlives the command) and each one waits up to N seconds, then
# leaves what is done in $OUT/gpu_day.tar.gz:
#     bash scripts/gpu/gpu_day.sh --detach --wait 540
#     bash scripts/gpu/gpu_day.sh --wait 540          # the next commands, same machine
# A 15-minute loan fits the search (5 minutes) and its side-by-side, in one command:
#     bash scripts/gpu/gpu_day.sh --detach --only 3 --only 3b --search-min 5 --budget-min 12 --wait 565
# the next loan the language-model search (the LM wheels below staged; 4 minutes, then its winner's parity and
# re-measurement), the one after its winner beside the recipe, then the parity rows:
#     bash scripts/gpu/gpu_day.sh --detach --only 3c --budget-min 13 --wait 565
#     bash scripts/gpu/gpu_day.sh --detach --only 3d --only 4 --budget-min 13 --wait 565
# A warm machine goes back after about 30 s idle: start the next --wait at once, and
# unpack the last tarball while it runs (the day writes in /tmp/gpu_day/, outside the
# tree each command copies, so the order does not matter). Back here, unpack each
# tarball in the repo root (tar xzf .../gpu_day.tar.gz) and
# commit scripts/measurements/<gpu>-<date>/ and the landscape. On a machine given back
# before the day ended, the same first command goes on where it stopped (the unpacked
# results travel with the working tree). In the foreground: bash scripts/gpu/gpu_day.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
# What `autotune search --backend local` needs that the GPU host lacks (/work/.library/device/KINDS.md:
# torch, pandas, pyyaml, numpy, tqdm, packaging, typing-extensions, markupsafe are
# there): optuna and its needs, alembic + sqlalchemy + mako for optuna.db; the typed spec
# (pydantic, pydantic-core, annotated-types, typing-inspection, and a typing-extensions as new as
# pydantic asks); the CLI (typer, annotated-doc, click, shellingham; rich, markdown-it-py, mdurl,
# pygments). No Ray, no MLflow: the local backend needs neither. The versions are this checkout's
# .venv's, the ones the tests ran.
WHEELS=(optuna colorlog sqlalchemy alembic mako
        pydantic pydantic-core annotated-types typing-inspection typing-extensions
        typer annotated-doc click shellingham rich markdown-it-py mdurl pygments)
# The language-model step (bench_llm.py: TRL's SFT script): TRL and datasets (with dill and multiprocess; the host
# has pyarrow, xxhash, fsspec, accelerate, tokenizers), and transformers at the tests' version (the host's is 5.17).
LM_WHEELS=(trl datasets dill multiprocess transformers)
# Liger's kernels and torchao's float8, which this checkout does not install (a knob of theirs is "not run" where
# they are missing): pinned here, for the host's torch 2.11 (torchao 0.17 loads its C++ ops from torch 2.11 on) and
# Python 3.12. flash-attn's wheel is too large for a loan's carry and is left out: flash attention is "not run".
PINNED=(liger-kernel==0.8.5 torchao==0.17.0)

if [ "${1:-}" = "--stage" ]; then
    mkdir -p .whl
    pins=("${PINNED[@]}")
    for name in "${WHEELS[@]}" "${LM_WHEELS[@]}"; do
        pins+=("$name==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    for pin in "${pins[@]}"; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
            -d .whl "$pin"
    done
    (git describe --always --dirty 2>/dev/null || echo unknown) >.whl/COMMIT  # the device copy has no .git
    ls -s --block-size=K .whl && du -sh .whl
    exit 0
fi
if [ -d .whl ] && ! "$PY" -c "import optuna" 2>/dev/null; then  # on the GPU host: install the staged wheels
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu/gpu_day.py "$@"
