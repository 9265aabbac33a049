#!/usr/bin/env bash
# The measurement checks in one command: trial fidelity (CV over fresh trials,
# trial vs a plain PyTorch loop, profiler overhead) and the classic ResNet-18 case
# at defaults vs 8 workers + pinned memory, with the diagnosis of each. On a CPU
# the GPU parts are skipped and fidelity runs on the tiny CNN. Needs torch only.
# The last line is one JSON object. REPS (default 5) sets the fidelity repetitions.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    fidelity_args=(--workload resnet18_cifar --set num_workers=8 --set pin_memory=true)
else
    fidelity_args=(--workload tiny_cnn --cpus 1)
fi
echo "== fidelity"
fidelity=$("$PY" scripts/bench/bench_fidelity.py "${fidelity_args[@]}" --reps "${REPS:-5}" ${FIDELITY_ARGS:-} | tee /dev/stderr | tail -n 1)
echo "== classic case: ResNet-18, batch 32, defaults vs 8 workers + pinned memory"
classic=$("$PY" scripts/gpu/classic_case.py | tee /dev/stderr | tail -n 1)
echo "{\"fidelity\": $fidelity, \"classic\": $classic}"
