"""Tests of paxlite.formats.t5x.api: T5X's configurables."""
