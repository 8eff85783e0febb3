"""``python -m paxlite.bench_sweep``: the public name of :mod:`paxlite.perf.bench_sweep`
(the weak-scaling sweep), kept for the docs' command and users' scripts."""

import sys

from paxlite.perf import bench_sweep

if __name__ == "__main__":
    bench_sweep.main()
else:
    sys.modules[__name__] = bench_sweep
