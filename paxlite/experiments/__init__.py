"""Experiments as the trainer meets them: the registry (@register, names to classes),
BaseExperiment (typed UPPERCASE knobs, datasets(), task() and the typed answers the trainer asks
for), knob types, and tasks_lib (the task config: model, learner, step settings).

May import: `paxlite.runtime` (batch arithmetic, the mesh), `paxlite.train` (which parameters
train) and `praxis_lite`; never ``tasks``, except the registry, which imports the module that
defines a name it is asked for.
"""
