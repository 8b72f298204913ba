"""The comparison engine: two aligned traces, their values compared event by event.

`Differ` holds both traces, their alignment (`align/sequence.py`) and cached comparisons; it
answers "are these outputs equal (bitwise / within tolerance)?", "do this event's
inputs match?" and searches the first divergence in the order of trace a (the rules are
in `locate.py`'s docstring). Its parts, one concern each, are in `engine/`; this module
puts them together. `pairing/cross.CrossDiffer` is the same engine for traces of two
frameworks. Everything that builds on comparisons (locate, explain, chain, profile)
imports from here; this module imports none of them.
"""

import numpy as np

from ..trace.blob import ValueReader
from ..trace.values import has_bytes
from .align import sequence as _align
from .compare import values as compare
from .engine.findings import FindingBuilder
from .engine.inputs import InputJudgement
from .engine.scan import ToleranceScan
from .engine.search import DivergenceSearch
from .engine.values import ValueJudgement

BITWISE, TOLERANCE = compare.BITWISE, compare.TOLERANCE   # re-exported: callers take them from here


comparable = has_bytes   # a value whose numbers can be compared


class Differ(FindingBuilder, DivergenceSearch, ToleranceScan, InputJudgement, ValueJudgement):
    """The state of one comparison: both traces, their alignment, cached comparisons; what
    it does with them is in its parts (`engine/`: values, inputs, scan, search, findings)."""

    def __init__(self, ta, tb, rtol=None, atol=None, alignment=None, sides=None):
        self.ta, self.tb = ta, tb
        self.rtol, self.atol = rtol, atol
        self._departed_cache = {}   # (call a, call b, level) -> departed devices
        if sides is None:
            strings = _align.StringIds()
            sides = _align.prepare(ta, strings), _align.prepare(tb, strings)
        self.sa, self.sb = sides
        self.al = alignment or _align.align(self.sa, self.sb)
        self.ra, self.rb = ValueReader(ta), ValueReader(tb)
        self._cmp = {}
        self._cmp_val = {}
        self.pair_by = {}   # a event -> how it was paired (cross-framework)

    ulp = None        # --ulp N: an element within N ULP is within tolerance
    progress = None   # progress(phase, done, total), set by locate() for the CLI's bar
    noisy = None      # bool per a event: nondeterministic on a's machine (--noise)
    noise_skipped = ()

    def _tell(self, phase, done=None, total=None):
        if self.progress is not None:
            self.progress(phase, done, total)

    # -- pairs -----------------------------------------------------------------------------
    def pairs(self):
        ia = np.flatnonzero(self.al.a2b >= 0)
        return ia, self.al.a2b[ia]

    def candidate_pairs(self):
        """Paired events whose output content hashes differ, in the order of trace a."""
        ia, ib = self.pairs()
        diff = self.sa.content[ia] != self.sb.content[ib]
        return ia[diff], ib[diff]
