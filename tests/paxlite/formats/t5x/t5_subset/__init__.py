"""Tests of paxlite.formats.t5x.t5_subset: T5's data package subset."""
