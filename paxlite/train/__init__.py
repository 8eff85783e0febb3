"""Training: the train state, pure step builders, init-or-restore with jitted steps, the
loop, its periodic actions (summaries, checkpoints, eval, decode, profiling), which parameters
train, input prefetch and the console/TensorBoard summaries.

May import: `paxlite.checkpoints`, `paxlite.evaluation`, `paxlite.experiments`, `paxlite.perf`,
`paxlite.runtime` and `praxis_lite`.
"""
