"""Experiments in a user package outside tasks/, imported on demand by the registry tests."""
