"""The one exception type the CLI turns into a one-line message and exit code 2."""


class TraceError(Exception):
    """Bad user input: a missing, corrupt, foreign or unsupported file, a bad argument."""
