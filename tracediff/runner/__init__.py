"""Run an unmodified script as __main__ under recording, and always close the trace.

The script gets its own argv, its folder first on sys.path and its exit status; an
exception, sys.exit, Ctrl-C or SIGTERM still leaves a complete, readable trace whose
manifest says how the run ended. A child the script forks leaves through the same code
and must not close (or claim) the parent's trace; a trace the script deleted, replaced
or lost the descriptor of is reported as lost, never as written.

By phase: output.py (where the trace goes, checked before the script runs),
recording.py (a `Recording` and how it starts), script.py (`record_script`: running the
script and how it ended), closing.py (how a recording stops and closes the trace),
signals.py (exit status, SIGTERM and Ctrl-C, ending by a signal; with ../term_watch.py).
"""
