"""tracediff: find the first operation where two runs of a numerical ML program disagree.

Pipeline: capture (per framework) -> trace (one versioned HDF5 file) -> diff (align,
compare, locate) -> report (terminal, JSON).
"""

__version__ = "0.1.0"


def load(path):
    """Open a trace file read-only (no code in it is ever executed)."""
    from .trace.reader import Trace

    return Trace(path)


def locate(a, b, rtol=None, atol=None, map_file=None):
    """Compare two traces (paths or open traces); returns a result whose `.to_json()` is
    what `tracediff locate --json` prints and whose `.exit_code` is its exit code."""
    from .diff.locate import locate as _locate

    return _locate(a, b, rtol=rtol, atol=atol, map_file=map_file)
