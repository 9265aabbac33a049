#!/usr/bin/env bash
cd /work/main
log=/tmp/meas3/log.txt
echo "$(date -u +%T) start bench_drift (2) load $(cut -d' ' -f1-3 /proc/loadavg) rev $(git rev-parse --short HEAD)" >> $log
.venv/bin/python scripts/bench/bench_drift.py --kinds quickstart,memmap_loop,hf_bert,lightning_clip --runs 2 --sides after --out /tmp/meas3/drift2 > /tmp/meas3/drift2.txt 2>&1
echo "$(date -u +%T) end bench_drift (2) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $log
