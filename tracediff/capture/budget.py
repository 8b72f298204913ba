"""The script's recursion budget, kept the plain run's while it is recorded.

Recording adds frames below the script (`python -m tracediff`, click, runpy: ~17) and
above each recorded op (the dispatch wrappers, the recorder, a flush through h5py: ~20
more), and Python counts them all against `sys.getrecursionlimit()`: a script that runs
a torch op 20 frames short of the limit raised RecursionError when recorded only.

- `Shift` (`tracediff record`, while the script runs): the interpreter's limit is raised
  by the frames below the script that a plain run does not have, and the script sees its
  own limit: `sys.getrecursionlimit` / `sys.setrecursionlimit` are wrapped to subtract /
  add that shift. `ENTRY` frames more let torch's own dispatch frames (it looks up
  Python dispatch rules before calling a mode) and the recorder's first frame stand on
  the script's deepest one.
- `raise_limit` / `restore_limit` (around each recorded op): `HEADROOM` more frames for
  the recorder, taken back when the op returns. The script's own recursion still fails
  where it would plainly (to within `ENTRY` frames).
"""

import sys

# the interpreter's own functions, whatever the script or `Shift` put in `sys` later
get_limit, set_limit = sys.getrecursionlimit, sys.setrecursionlimit

HEADROOM = 250   # the recorder's frames above a recorded op, with room to spare
ENTRY = 10       # frames of torch's own (find_torch_dispatch_rule: ~6) and the recorder's first
# Measured (CPython 3.11): `depth()` called at a plain script's top level reads 3 (its
# module frame: 2); `record_script`'s `depth()` reads 5 less than one called in the
# script's module (runpy.run_path and its helpers, exec).
PLAIN_MODULE_DEPTH = 2
RUNPY_FRAMES = 5


def depth():
    """The recursion depth of the caller's frame plus one, as the interpreter counts it
    against the limit: the smallest limit `setrecursionlimit` accepts here, less one."""
    limit = get_limit()
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            set_limit(mid)
            hi = mid
        except RecursionError:
            lo = mid + 1
    set_limit(limit)
    return lo - 1


class Shift:
    """While the script runs: the real limit is the script's plus `frames`, and the
    script's `sys.getrecursionlimit()` / `sys.setrecursionlimit(n)` read and set its own."""

    def __init__(self, frames):
        self.frames = max(int(frames), 0)
        self.saved = None

    def __enter__(self):
        frames = self.frames
        self.saved = (sys.getrecursionlimit, sys.setrecursionlimit)
        set_limit(get_limit() + frames)

        def getrecursionlimit():
            return get_limit() - frames

        def setrecursionlimit(limit):
            if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
                set_limit(limit + frames)
            else:
                set_limit(limit)   # the interpreter's own error for a bad value

        getrecursionlimit.__doc__ = get_limit.__doc__
        setrecursionlimit.__doc__ = set_limit.__doc__
        sys.getrecursionlimit, sys.setrecursionlimit = getrecursionlimit, setrecursionlimit
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            return
        sys.getrecursionlimit, sys.setrecursionlimit = self.saved
        self.saved = None
        try:
            set_limit(max(get_limit() - self.frames, 1))
        except RecursionError:   # deeper than that now: leave the higher limit
            pass


def below_script():
    """The frames `tracediff record` has below the script's module frame that a plain
    `python script.py` does not (called from `record_script`, just before runpy)."""
    return max(depth() - 1 + RUNPY_FRAMES - PLAIN_MODULE_DEPTH, 0) + ENTRY
