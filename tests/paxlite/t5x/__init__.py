"""Tests of paxlite.t5x: T5X's commands."""
