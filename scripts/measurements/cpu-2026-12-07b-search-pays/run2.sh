#!/usr/bin/env bash
cd /work/main
PY=.venv/bin/python
step() { name=$1; shift; echo "== $name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/meas/log.txt; "$@" > /tmp/meas/$name.txt 2>&1; echo "== $name end $(date +%T) rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/meas/log.txt; }
while pgrep -f "bench_online.py --only too_many" > /dev/null; do sleep 2; done
echo "== too_many_1 end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/meas/log.txt
for i in 2 3; do step too_many_$i $PY scripts/bench/bench_online.py --only too_many; done
step quickstart $PY -m autotune.cli.main search search_spaces/examples/quickstart.yaml -q -o /tmp/meas/quickstart --refresh
step quickstart_report $PY -m autotune.cli.main report /tmp/meas/quickstart --no-plots
step drift $PY scripts/bench/bench_drift.py --kinds quickstart --runs 6 --sides after --out /tmp/meas/drift
echo ALLDONE >> /tmp/meas/log.txt
