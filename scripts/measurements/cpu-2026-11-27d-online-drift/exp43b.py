"""Does a fixed loader config's rate drift over the 40 s after its loader starts? tiny_cnn cached, 4 and 1 workers."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "scripts/bench"), str(ROOT)]

import bench_online as B  # noqa: E402
from trials.tiny_cnn import RandomImages, tiny_cnn  # noqa: E402  # noqa: E402

job = B.Job(RandomImages(10**6), tiny_cnn(), 64)
for n in [int(x) for x in sys.argv[1].split(",")]:
    run = B.train(job.loader(**B.knobs_of(n)), job.model, job.opt, float(sys.argv[2]))
    tr = run["trace"]
    print(n, "workers:", " ".join(f"{B.trailing(tr, t + 4, 4):.0f}" for t in range(0, int(sys.argv[2]), 4)), flush=True)
