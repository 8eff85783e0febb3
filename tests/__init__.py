"""Tests for the paxlite packages; mirrors the source tree."""
