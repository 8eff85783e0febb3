"""paxlite: the trainer library (experiments, registry, mesh, train loop) for praxis_lite layers."""
