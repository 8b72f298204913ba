"""The one exception type the CLI turns into a one-line message and exit code 2."""


class TraceError(Exception):
    """Bad user input: a missing, corrupt, foreign or unsupported file, a bad argument."""


class UnsupportedJax(TraceError):
    """The installed JAX is outside the range whose internals capture knows: recording it
    would give wrong traces. Raised, never `SystemExit`, so `tracediff.record()` callers
    can catch it; the CLI prints its one line and exits 2."""
