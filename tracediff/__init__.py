"""tracediff: find the first operation where two runs of a numerical ML program disagree.

Pipeline: capture (per framework) -> trace (one versioned HDF5 file) -> diff (align,
compare, locate) -> report (terminal, JSON).
"""

__version__ = "0.1.0"


def load(path):
    """Open a trace file read-only (no code in it is ever executed)."""
    from .trace.reader import Trace

    return Trace(path)
