"""What a capture could not read or format, kept for the manifest: an optimizer setting
whose `repr`, `str`, `float` or `==` raises, a module or parameter key that is not a str.

Why: such an object is the program's, and the plain run never formats it; recording must
not stop on it (one raised out of the optimizer-step hook stopped the whole torch capture,
and one in the module hook broke the script's forward). The datum is skipped (a name gets a
stand-in), counted, and the first few are named in the manifest (`Skipped.manifest`), which
`record` and `info` report (trace/manifest.py, `capture_losses`).

`text` names a key without calling anything the program defined: an exact str, int, float
or bool through the base type's own method, anything else not at all.
"""

MAX_NAMED = 5        # the first few skipped data named in the manifest
MAX_SEEN = 1000      # distinct data counted; past that, occurrences only


class Skipped:
    """Data a capture skipped, by where (a step's same setting counts once)."""

    def __init__(self, what, note):
        self.what = what            # "optimizer settings", "module and parameter keys"
        self.note = note            # what became of them
        self.seen = set()
        self.first = []
        self.times = 0

    def add(self, where, exc=None):
        """Note the datum at WHERE (a short text of tracediff's own) skipped for EXC."""
        self.times += 1
        where = where[:120]
        if where in self.seen or len(self.seen) >= MAX_SEEN:
            return
        self.seen.add(where)
        if len(self.first) < MAX_NAMED:
            self.first.append(f"{where}: {kind(exc)}" if exc is not None else where)

    def __bool__(self):
        return self.times > 0

    def manifest(self):
        """{"count": distinct data, "times": occurrences, "first": [...], "note"}, or None."""
        if not self.times:
            return None
        return {"count": len(self.seen), "times": self.times, "first": list(self.first),
                "note": f"{self.what} tracediff could not read or format: {self.note}; "
                        f"recording went on"}


def settings():
    return Skipped("optimizer settings", "left out of the trace")


def names():
    return Skipped("module and parameter keys", "named by their type (<Type>)")


def kind(v):
    """The name of v's type (an exception's: its kind), never raising."""
    try:
        name = type(v).__name__
        return name if isinstance(name, str) else "?"
    except Exception:
        return "?"


def text(key):
    """KEY as text through its base type's own method (a str subclass's overrides are not
    called), or None for anything but a str, bool, int or float."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bool):
        return "True" if key else "False"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    return None


def name(key):
    """KEY as text, or its type in angle brackets (`<Key>`) where `text` has none."""
    got = text(key)
    return got if got is not None else f"<{kind(key)}>"
