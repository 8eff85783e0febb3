"""Where and how a job runs: the job built for this process, the device mesh, batch
arithmetic, partitioning of batches and state, joined processes, job-directory storage (local or
gs://), TPU topologies for compile-only runs, GPU flags, the kernels for the platform (attention;
a mixture of experts' grouped matmuls).

May import: `paxlite.cli` (the usage error), `paxlite.evaluation` (whether the model decodes),
`paxlite.experiments`, `paxlite.train` (which parameters train) and `praxis_lite`.
"""
