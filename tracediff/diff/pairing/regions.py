"""Forward pairing's steps after strict dataflow (dataflow.py, `_pair_forward`): units whose
outputs broadcast to each other, the points where the two sides' values meet, a composite's
last units, and two modules' outputs, each region between compared as one unit.

Why apart: these steps pair regions, not single ops, by what their values and modules
say where the two programs compute one value by other ops; strict pairing and the
backward stay in dataflow.py.
"""

import collections

from ..differ import comparable
from .graph import broadcast_pair

MAX_MEET_COMPARISONS = 2000         # value comparisons per class to find where two sides meet
INDEX_ROLE = "dataflow (indices by role)"


class RegionSteps:
    """Steps 1b-3 of `Pairing._pair_forward` (mixed into `Pairing`)."""

    def _pair_broadcast(self, la, lb, n_atoms):
        """Step 1b: two units of one family and dtype whose direct inputs pair, one's output
        the shape the other's broadcasts to (Flax's position embeddings looked up for [2, 8]
        positions, torch's for its [1, 8] buffer); the latest first (an init-time forward on
        constants precedes the apply-time one)."""
        by_kind = collections.defaultdict(list)
        for y in reversed(lb):
            if y not in self.pair_of[1]:
                uy = self.gb.units[y]
                by_kind[(uy.family, uy.dtype, self.groups[1][y])].append(y)
        for x in reversed(la):
            ux = self.ga.units[x]
            if x in self.pair_of[0]:
                continue
            for y in by_kind.get((ux.family, ux.dtype, self.groups[0][x]), ()):
                uy = self.gb.units[y]
                if uy.size == ux.size or not broadcast_pair(ux.shape, uy.shape):
                    continue
                keys = self._complete_keys(0, x)
                if keys is None or self._complete_keys(1, y) != keys:
                    continue
                self._add(x, y, "dataflow",
                          f"same op family, computed from the same {n_atoms} paired input(s) "
                          f"and parameter(s); its {len(keys)} direct input(s) are the same "
                          f"values or made by paired ops; one output broadcasts to the other "
                          f"({list(ux.shape)} and {list(uy.shape)})")
                return True
        return False

    def _pair_other_shape(self, la, lb, n_atoms):
        """Step 1c: the same inputs, a different result. The one unpaired unit of a family
        on each side whose direct inputs pair, in corresponding modules, whatever their
        output shapes (a port's conv with stride 2 where the other's has 1: [2, 6, 6, 8]
        against [2, 8, 3, 3]). The pair is the finding: its shapes and arguments differ,
        its inputs do not. Only where the family's unit is alone with those inputs on both
        sides, so that no correct port pairs two ops of one family that compute other
        things from one value."""
        cands = ({}, {})
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if k in self.pair_of[s] or self._index_unit(s, k):
                    continue
                keys = self._complete_keys(s, k)
                if keys:
                    u = g.units[k]
                    cands[s].setdefault((u.family, keys, int(self.groups[s][k])), []).append(k)
        for key, xs in cands[0].items():
            ys = cands[1].get(key, ())
            if len(xs) != 1 or len(ys) != 1:
                continue
            x, y = xs[0], ys[0]
            ux, uy = self.ga.units[x], self.gb.units[y]
            if ux.shape == uy.shape or broadcast_pair(ux.shape, uy.shape) or \
                    not self.modules_correspond(self.unit_module(0, x), self.unit_module(1, y)):
                continue
            self._add(x, y, "dataflow (other shape)",
                      f"same op family, computed from the same {n_atoms} paired input(s) and "
                      f"parameter(s); its {len(key[1])} direct input(s) are the same values or "
                      f"made by paired ops, in corresponding modules; its output has another "
                      f"shape ({list(ux.shape)} and {list(uy.shape)})")
            return True
        return False

    def _pair_index_role(self, la, lb):
        """Step 1d: a lookup whose indices differ. The one unpaired unit of a family on each
        side, in corresponding modules, whose float inputs pair and whose integer inputs
        (position ids, token ids) do not: one side given them, the other computing them
        (HF RoBERTa's positions after the padding index, from the ids). The indices play
        one role, read by the same op from the same table; the pair compares the lookups,
        and the indices are the input that differs."""
        cands = ({}, {})
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if k in self.pair_of[s] or self._index_unit(s, k):
                    continue
                keys = self._float_keys(s, k)
                if keys:
                    u = g.units[k]
                    cands[s].setdefault((u.family, keys, int(self.groups[s][k])), []).append(k)
        for key, xs in cands[0].items():
            ys = cands[1].get(key, ())
            if not ys or min(len(xs), len(ys)) != 1:
                continue
            x, y = xs[-1], ys[-1]      # the latest: an init-time forward precedes the apply
            if not self.modules_correspond(self.unit_module(0, x), self.unit_module(1, y)):
                continue
            self._add(x, y, INDEX_ROLE,
                      f"same op family; its {len(key[1])} float input(s) are the same values or "
                      f"made by paired ops, in corresponding modules; its integer inputs "
                      f"(indices) are not paired: compared as the indices of this op")
            return True
        return False

    def _float_keys(self, s, k):
        """What unit k reads directly, as `_complete_keys` says, its integer inputs left out;
        None where a float input is unpaired or it reads no integer input that is unpaired."""
        return self._complete_keys(s, k, indices_apart=True)

    def modules_correspond(self, ma, mb):
        """Module path `ma` of a is `mb` of b: learned from the pairs, or the same last name,
        or both the top level (Flax's root module against torch's "")."""
        hit = self.counterpart(ma)
        if hit is not None:
            return hit == mb
        ca, cb = ma.split("/") if ma else [], mb.split("/") if mb else []
        return (ca[-1:] == cb[-1:] and bool(cb)) or (len(ca) <= 1 and not cb)

    def _agree_units(self, ka, kb):
        """The outputs of unit ka of a and kb of b agree within tolerance (True where they
        cannot be compared)."""
        ra, rb = self.out_row(0, ka), self.out_row(1, kb)
        if self.agree is None or ra is None or rb is None or not comparable(ra) \
                or not comparable(rb):
            return True
        return self.agree(ra, rb)

    def _pair_meeting(self, la, lb, n_atoms, by_module=False):
        """Step 2 of `_pair_forward`: the latest unpaired unit of a whose output agrees
        with an unpaired unit of b of the same size (latest first), within tolerance. In
        the backward (`by_module`), within one module pair: torch's `_softmax_backward_data`
        meets the end of Flax's softmax transpose, the scale after it is torch's own."""
        if self.agree is None:
            return False
        left = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if self.pair_key(s, k) is None and not self._index_unit(s, k):
                    u = g.units[k]
                    left[(u.size, int(self.groups[s][k]),
                          self._module_id(s, u.module) if by_module else "")][s].append(k)
        budget = MAX_MEET_COMPARISONS
        for xs, ys in left.values():
            for x in reversed(xs):
                ra = self.out_row(0, x)
                if ra is None or not comparable(ra):
                    continue
                for y in reversed(ys):
                    rb = self.out_row(1, y)
                    if rb is None or not comparable(rb):
                        continue
                    budget -= 1
                    if budget < 0:
                        return False
                    if self.agree(ra, rb):
                        na, nb = len(self.region(0, x)), len(self.region(1, y))
                        self._add(x, y, "dataflow (values meet)",
                                  f"the two sides reach this value by different ops ({na} of a, "
                                  f"{nb} of b since the last pairs): their outputs agree within "
                                  f"tolerance, computed from the same {n_atoms} paired input(s) "
                                  f"and parameter(s)")
                        return True
        return False

    def _pair_composite(self, la, lb, n_atoms):
        """Step 2b of `_pair_forward`, where no values meet (a difference inherited from
        earlier, or made here): the last unpaired unit of a with the last of b of the same
        size (a LayerNorm's equations against `native_layer_norm`, the scores `(q/sqrt d) k^T`
        against `(q k^T)/sqrt d`); values one side recomputes (`pair_key`) are not left over."""
        left = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            # only what follows the class's last pair: a unit before it was passed by the
            # other side's ops on the way to a value both reach (torch eager's unscaled scores)
            start = max((k for k in lst if k in self.pair_of[s]), default=-1)
            for k in lst:
                if k > start and self.pair_key(s, k) is None and not self._index_unit(s, k):
                    u = g.units[k]
                    left[(u.size, u.dtype, int(self.groups[s][k]))][s].append(k)
        for xs, ys in left.values():
            if xs and ys:
                self._add(xs[-1], ys[-1], "dataflow (composite)",
                          f"the last of {len(xs)} op(s) of a and {len(ys)} of b computed from the "
                          f"same {n_atoms} paired input(s) and parameter(s); their values do not "
                          f"meet")
                return True
        return False

    def _pair_module_output(self, la, lb, n_atoms):
        """Step 3 of `_pair_forward`: the last unpaired unit of a module on a with the last
        of its counterpart on b (the deepest module both end), sizes equal."""
        xs = [k for k in la if self.pair_key(0, k) is None and not self._index_unit(0, k)]
        ys = [k for k in lb if self.pair_key(1, k) is None and not self._index_unit(1, k)]
        ends_b = {y: self._module_ends(1, y) for y in ys}
        for x in reversed(xs):
            ux = self.ga.units[x]
            for ma in self._module_ends(0, x):
                mb = self.counterpart(ma)
                if mb is None:
                    continue
                y = next((y for y in reversed(ys) if mb in ends_b[y] and
                          self.gb.units[y].size == ux.size and
                          self.groups[1][y] == self.groups[0][x]), None)
                if y is None:
                    continue
                na, nb = len(self.region(0, x)), len(self.region(1, y))
                self._add(x, y, "module output",
                          f"the output of module {ma or '(top level)'!r} <-> "
                          f"{mb or '(top level)'!r}: nothing inside meets ({na} op(s) of a, "
                          f"{nb} of b since the last pairs), compared as one unit, computed "
                          f"from the same {n_atoms} paired input(s) and parameter(s)",
                          modules=(ma, mb))
                return True
        return False
