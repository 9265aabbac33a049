#!/usr/bin/env bash
cd /work/main
PY=.venv/bin/python
M=/tmp/meas2
step() { name=$1; shift; echo "== $name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $M/log.txt; "$@" > $M/$name.txt 2>&1; rc=$?; echo "== $name end $(date +%T) rc=$rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> $M/log.txt; }
step compile_search2 $PY scripts/bench/bench_compile.py --part search --budget 240 --main /tmp/before62 --out $M/compile_search2
step drift_programs $PY scripts/bench/bench_drift.py --kinds memmap_loop,lightning_clip --runs 3 --sides after --out $M/drift_programs
echo ALLDONE2 >> $M/log.txt
