# Issue 62's compile seconds, 2026-12-08: a whole LM search's compile trials with this checkout's autotune and with
# main's before issue 62 (8894ece, a worktree at /tmp/main62), the same seed and budget; one pair at a time, alone.
# bc1/bc2: before the eager-twin rule (07ebd47); bc3: the rule for the climb's own moves (258511a); bc4/bc5: the
# rule for the incumbent's diagnosis too (a06dcbc); bc6/bc7: the compile move lean, a compiled move only where its
# eager gain counted, the explorer's compiled draws eager first (c00d7ec).
set -e
LOG="$(dirname "$(readlink -f "$0")")/log.txt"
cd "$(git rev-parse --show-toplevel)"
git worktree add --detach /tmp/main62 8894ece 2>/dev/null || true
for i in "$@"; do
  echo "pair $i start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG"
  .venv/bin/python scripts/bench/bench_compile.py --part search --budget 240 --main /tmp/main62 --out /tmp/m/bc$i \
    > /tmp/m/bc$i.txt 2>&1
  echo "pair $i end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG"
done
