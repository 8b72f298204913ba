"""The one exception type the CLI turns into a one-line message and exit code 2, and how
any exception becomes that one line."""

from .untrusted import printable


class TraceError(Exception):
    """Bad user input: a missing, corrupt, foreign or unsupported file, a bad argument."""


class UnsupportedJax(TraceError):
    """The installed JAX is outside the range whose internals capture knows: recording it
    would give wrong traces. Raised, never `SystemExit`, so `tracediff.record()` callers
    can catch it; the CLI prints its one line and exits 2."""


def one_line(exc, limit=500, with_type=False):
    """The message of `exc` as one printable line of at most `limit` characters (messages
    quote file names and trace strings); `with_type` prefixes the exception's type."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    text = printable(" ".join(lines), limit) if lines else type(exc).__name__
    return f"{type(exc).__name__}: {text}" if with_type and lines else text
