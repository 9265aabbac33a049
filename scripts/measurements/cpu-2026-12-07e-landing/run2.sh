#!/usr/bin/env bash
# issue 64: bench_drift with the 10% prior (b32b601), one benchmark at a time, quiet host
cd /work/main
log=/tmp/meas5/log.txt
echo "$(date -u +%T) start bench_drift load $(cut -d' ' -f1-3 /proc/loadavg) rev $(git rev-parse --short HEAD)" >> $log
.venv/bin/python scripts/bench/bench_drift.py --kinds quickstart,memmap_loop,hf_bert,lightning_clip --runs 3 --sides after --out /tmp/meas5/drift > /tmp/meas5/drift.txt 2>&1
echo "$(date -u +%T) end bench_drift rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $log
