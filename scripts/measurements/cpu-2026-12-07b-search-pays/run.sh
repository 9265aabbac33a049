#!/usr/bin/env bash
cd /work/main
PY=.venv/bin/python
step() { name=$1; shift; echo "== $name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/meas/log.txt; "$@" > /tmp/meas/$name.txt 2>&1; echo "== $name end $(date +%T) rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/meas/log.txt; }
step compile_production $PY scripts/bench/bench_compile.py --part production --pairs 5 --out /tmp/meas/compile_prod
step peer $PY scripts/bench/bench_peer.py --budget 300 --reps 3 --out /tmp/meas/peer
for i in 1 2 3; do step too_many_$i $PY scripts/bench/bench_online.py --only too_many; done
step compile_search $PY scripts/bench/bench_compile.py --part search --budget 240 --main /tmp/before62 --out /tmp/meas/compile_search
echo ALLDONE >> /tmp/meas/log.txt
