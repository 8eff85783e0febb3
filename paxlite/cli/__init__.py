"""The command line: flags and the Mode they choose, overrides (--set, --fdl_set,
fiddlers), paxml 1.4 main.py flags, exit codes, the errors that are bad input (refusals)
and the one-line error reports.

May import: `paxlite.experiments`, `paxlite.runtime`, `paxlite.train` (the preempted exit code)
and `praxis_lite`.
"""
