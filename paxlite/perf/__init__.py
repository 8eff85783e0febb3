"""Performance: model and XLA FLOPs, peak FLOP/s and MFU, the cost of a step, the
benchmark with its report and weak-scaling sweep, compile-only (AOT) runs and profiler traces.

May import: `paxlite` (its version), `paxlite.experiments`, `paxlite.runtime`, `paxlite.train`
and `praxis_lite`.
"""
