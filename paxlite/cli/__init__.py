"""The command line: flags and the Mode they choose, overrides (--set, --fdl_set,
fiddlers), paxml 1.4 main.py flags, exit codes, the errors that are bad input (refusals),
the one-line error reports, and the parsing of commands with their own flags (own_flags).

May import: `paxlite.experiments`, `paxlite.runtime`, `paxlite.train` (the preempted exit code)
and `praxis_lite`.
"""
