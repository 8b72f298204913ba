"""A pair of two frameworks that differs only by the rounding it inherited (`CrossDiffer`'s
search skips it).

Why apart: across frameworks after an optimizer step every parameter differs by
rounding, and a residual add near zero then differs element by element beyond tolerance
while nothing diverged there; telling such a pair from a port bug is its own judgement
(inputs within tolerance, outputs within tolerance as a whole, not amplified).
"""

import numpy as np

from ...trace import schema
from ..compare import values as compare
from ..differ import comparable

AMPLIFIED = 10.0       # output rel L2 up to 10x the inputs': their rounding, carried


class RoundingInherited:
    """`_rounding_inherited` and the norm-wise comparison it uses (mixed into CrossDiffer)."""

    def _normwise(self, row_a, row_b):
        """(||a - b|| / ||a||, within rtol * ||a|| + atol * sqrt(n)) of two values, b laid
        out like a; None when they cannot be compared."""
        if row_a is None or row_b is None or not comparable(row_a) or not comparable(row_b):
            return None
        xa = np.asarray(self.ra.read(row_a))
        xb = self.transform_b(row_a, row_b, xa, np.asarray(self.rb.read(row_b)))
        if xa.shape != np.asarray(xb).shape or xa.dtype.kind != "f":
            return None
        xa, xb = _unmasked(xa, np.asarray(xb))
        l2 = compare.RelL2()
        l2.add(xa, xb)
        rtol, atol = compare.tolerance(self.ta.string(row_a["dtype"]), self.rtol, self.atol)
        return l2.value(), bool(np.sqrt(l2.diff) <= rtol * np.sqrt(l2.ref) +
                                atol * np.sqrt(xa.size))

    def _rounding_inherited(self, pr):
        """A pair beyond tolerance only element by element, where its values cancel (a
        residual add near zero), from inputs that differ by rounding alone: every input
        within tolerance (element-wise or as a whole: ||a - b|| <= rtol ||a|| + atol sqrt(n))
        but not all bitwise, every output within tolerance as a whole, and its relative L2
        at most `AMPLIFIED` times its inputs'. Across
        frameworks after an optimizer step every parameter differs by rounding, and such
        an element is not where anything diverged (a port bug adds more than it reads)."""
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        # a region (a LayerNorm's equations against native_layer_norm) by what it reads from
        # outside; an input of a's only (`own`: the input read twice, a's own constant) is
        # nothing that differs; a finding moved to where two formulas meet, by what its
        # span reads
        ins = [x for x in self.input_entries(ua.rep, pr.a, pr.b) if not x[3]]
        rel_in, bitwise = 0.0, True
        for row, rb, _, _ in ins:
            if row is None or rb is None:
                return False
            m = self.compare_rows(row, rb)
            if m is None:
                return False
            if not m["bitwise_equal"]:
                bitwise = False
                nw = self._normwise(row, rb)
                if not m["within_tolerance"] and (nw is None or not nw[1]):
                    return False
                rel_in = max(rel_in, nw[0] if nw else 0.0)
        if bitwise or not ins or rel_in == 0.0:
            return False
        rows_a = self.ta.value_rows(ua.rep, schema.ROLE_OUT)
        rows_b = self.tb.value_rows(ub.rep, schema.ROLE_OUT)
        for ra_, rb_ in zip(rows_a, rows_b):
            nw = self._normwise(ra_, rb_)
            if nw is None or not nw[1] or nw[0] > AMPLIFIED * rel_in:
                return False
        return bool(len(rows_a))

    def _undetermined_inherited(self, pr, tainted):
        """A pair that differs only because it reads, directly or through pairs judged so
        before (`tainted`, pair indices), a parameter whose last optimizer step was
        undetermined (`roles._noise_steps`: its gradient rounding noise, which Adam's
        normalisation makes steps of their own): every input beyond tolerance (element-wise
        and as a whole) is such a parameter (the row the optimizer snapshot holds) or such a
        pair's output, and one is. HF CLIP's
        key bias shifts every key's score, and softmax removes the shift again: the
        difference is nothing the program determines."""
        steps = self.optimizer_steps()
        if not steps:
            return False
        und = getattr(self, "undetermined_hashes", (set(), set()))
        if not und[0] and not und[1]:
            return False
        inherited = False
        for row, rb, key, own in self.input_entries(self.ga.units[pr.a].rep, pr.a, pr.b):
            if own:
                continue
            if row is None or rb is None:
                return False
            m = self.compare_rows(row, rb)
            if m is None:
                return False
            if m["within_tolerance"]:
                continue         # agrees
            if (key is not None and key[0] == "pair" and key[1] in tainted) or \
                    int(row["hash"]) in und[0] or int(rb["hash"]) in und[1]:
                inherited = True     # apart element-wise, by what the parameter shifted:
                continue             # even where that is within tolerance as a whole
            if (self._normwise(row, rb) or (0, False))[1]:
                continue         # differs by rounding as a whole
            return False
        return inherited


def _unmasked(xa, xb):
    """a and b without the elements where both hold a masking extreme of one sign (at least
    half the dtype's largest finite value, or an infinity: an additive attention mask's
    `finfo.min`). Norm-wise, such elements would be the whole norm: HF BERT's masked scores
    (-3.4e38 on both sides, 96 of 512) made Flax's softmax `x - max` of a port whose q and
    k were swapped "meet" torch's masked scores as a whole (relative L2 3e-40), where the
    unmasked ones are apart (relative L2 1.24, max abs 0.16)."""
    if xa.dtype.kind != "f" or xb.dtype != xa.dtype or not xa.size:
        return xa, xb
    big = np.finfo(xa.dtype).max / 2
    with np.errstate(invalid="ignore"):
        both = (np.abs(xa) >= big) & (np.abs(xb) >= big) & (np.signbit(xa) == np.signbit(xb))
    if not both.any():
        return xa, xb
    keep = ~both
    return xa[keep], xb[keep]
