"""Tests for paxlite."""
