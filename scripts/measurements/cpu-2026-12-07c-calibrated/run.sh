#!/usr/bin/env bash
cd /work/main
PY=.venv/bin/python
M=/tmp/meas2
step() { name=$1; shift; echo "== $name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $M/log.txt; "$@" > $M/$name.txt 2>&1; rc=$?; echo "== $name end $(date +%T) rc=$rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> $M/log.txt; }
for i in 1 2 3; do step too_many_$i $PY scripts/bench/bench_online.py --only too_many; done
step drift $PY scripts/bench/bench_drift.py --kinds quickstart --runs 6 --sides before,after --before 1687002^ --out $M/drift
step compile_search $PY scripts/bench/bench_compile.py --part search --budget 240 --main /tmp/before62 --out $M/compile_search
echo ALLDONE >> $M/log.txt
