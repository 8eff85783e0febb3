"""``python -m paxlite`` runs main."""

from paxlite.main import run

run()
