"""A search's trials as bench_compile.py left them (RUN_DIR/trials/*/result.json): each one's status, samples/s,
first step and compile seconds, what chose it, and the knobs it changes from the baseline's (trial 0)."""

import json
import sys
from pathlib import Path

SHOWN = "num_workers precision channels_last compile padding_free fused_optimizer attention num_threads batch_size"
SHOWN += " activation_checkpointing"
rows = [
    json.loads(p.read_text()) | {"n": p.parent.name} for p in sorted(Path(sys.argv[1]).glob("trials/*/result.json"))
]
base = rows[0]["knobs"]
print(
    f"{'trial':>5}  {'status':<7}  {'samples/s':>9}  {'first step':>10}  {'compile_s':>9}  {'chosen by':<40}  changed"
)
for r in rows:
    m, k = r.get("metrics") or {}, r.get("knobs") or {}
    changed = {n: k[n] for n in SHOWN.split() if n in k and k[n] != base.get(n)}
    fs, cs = m.get("first_step_s"), m.get("compile_s")
    print(
        f"{int(r['n']):>5}  {r['status']:<7}  {m.get('samples_per_s') or 0:>9.0f}  {fs or 0:>10.1f}  "
        f"{cs if cs is None else round(cs, 1)!s:>9}  {str(r.get('chosen_by') or '-')[:40]:<40}  {changed}"
    )
