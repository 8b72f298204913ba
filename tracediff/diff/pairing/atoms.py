"""Atoms and supports of cross-framework pairing (steps 2 and 3 of `dataflow.py`'s
docstring): a value both sides read with the same fingerprint (bytes, integer values, or
the same elements in another axis order) is an atom; a unit's support is the set of atoms
it depends on, through byte-moving ops and other units.
"""

import collections

import numpy as np

from ...trace.values import digest
from ..differ import comparable
from .graph import find_layout

MAX_DEPTH = 200             # passthrough hops followed back from one value
MAX_FINGERPRINT_BYTES = 256 << 20   # values read to fingerprint permuted arrays
MAX_SUPPORT_ELEMENTS = 20_000_000   # atoms held by the distinct supports of one side



class Atoms:
    """The atoms and supports of a `Pairing` (see the module docstring)."""

    def atom(self, side, row):
        """Atom id of a value row of one side, or None."""
        if row is None:
            return None
        g = self.ga if side == 0 else self.gb
        a = self.row_atom[side].get((int(row["event"]), int(row["slot"]), int(row["role"])))
        if a is not None:
            return a
        k = g.key(row)
        return self.atoms.get(k) if k is not None else None

    def _build_atoms(self, role_rows):
        seen = [collections.OrderedDict(), collections.OrderedDict()]   # key -> row
        rows_of = [[], []]
        computed = [set(), set()]
        for g, s in ((self.ga, 0), (self.gb, 1)):
            visited = set()
            for u in g.units:
                for _, _, nd in g.input_nodes(u):
                    for row, by_unit in g.walk_rows(nd, seen=visited):
                        rows_of[s].append(row)
                        k = g.key(row)
                        if k is not None and k not in seen[s]:
                            seen[s][k] = row
                        if k is not None and by_unit:
                            computed[s].add(k)
        # a value both sides compute (a layer's output that happens to be equal) is not a
        # cut: what reads it depends on what computed it, as on the other side
        self.computed = computed[0] & computed[1]
        self.computed_on = computed      # per side: keys of values a unit of that side computed
        for k, row in seen[0].items():
            rb = seen[1].get(k)
            if rb is not None:
                aid = len(self.atom_rows)
                self.atoms[k] = aid
                sa_, sb_ = self.ga.shape(row), self.gb.shape(rb)
                how = "equal bytes" if sa_ == sb_ else ("equal values" if k[0] == "i" and
                                                        self.ga.t.string(row["dtype"]) !=
                                                        self.gb.t.string(rb["dtype"])
                                                        else "equal bytes, other shape")
                if k[0] == "i" and self.ga.t.string(row["dtype"]) != self.gb.t.string(rb["dtype"]):
                    how = (f"equal values ({self.ga.t.string(row['dtype'])} vs "
                           f"{self.gb.t.string(rb['dtype'])})")
                self.atom_rows[aid] = (row, rb, how)
        self._permuted_atoms(rows_of, seen)
        for ra, rb in role_rows:          # updated parameters, by optimizer role
            ka, kb = self.ga.key(ra), self.gb.key(rb)
            if ka is None or kb is None:
                continue
            aid = self.atoms.get(ka, self.atoms.get(kb))
            if aid is None:
                aid = len(self.atom_rows)
                self.atom_rows[aid] = (ra, rb, "the same parameter after an optimizer step "
                                                "(by role)")
            self.atoms.setdefault(ka, aid)
            self.atoms.setdefault(kb, aid)

    def _permuted_atoms(self, rows_of, seen):
        """Float arrays of 2+ dims without an exact match: the same elements in another
        axis order (a conv kernel HWIO vs OIHW) make an atom too."""
        def pending(g, s):
            out = {}
            for row in rows_of[s]:
                k = g.key(row)
                if k is None or k[0] != "b" or k in self.atoms or not comparable(row):
                    continue
                if len(g.shape(row)) < 2:
                    continue
                out.setdefault((k[1], int(row["nbytes"])), {})[k] = row
            return out

        pa, pb = pending(self.ga, 0), pending(self.gb, 1)
        budget = MAX_FINGERPRINT_BYTES
        for sig in pa.keys() & pb.keys():
            fps = {}
            for g, s, rows in ((self.ga, 0, pa[sig]), (self.gb, 1, pb[sig])):
                for k, row in rows.items():
                    budget -= int(row["nbytes"])
                    if budget < 0:
                        return
                    x = np.asarray(g.reader.read(row))
                    bits = np.sort(np.ascontiguousarray(x).reshape(-1).view(
                        {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(x.itemsize, np.uint8)))
                    fps.setdefault(digest(bits.tobytes()), ([], []))[s].append((row, x))
            for fa_list, fb_list in fps.values():
                for (ra, xa), (rb, xb) in zip(fa_list, fb_list):
                    p = find_layout(xa, xb)
                    if p is None:
                        continue
                    aid = len(self.atom_rows)
                    self.atom_rows[aid] = (ra, rb, f"equal after permuting axes {tuple(p)}")
                    self.row_atom[0][(int(ra["event"]), int(ra["slot"]), int(ra["role"]))] = aid
                    self.row_atom[1][(int(rb["event"]), int(rb["slot"]), int(rb["role"]))] = aid
                    # every row of either side with these exact bytes is that atom
                    self.atoms.setdefault(self.ga.key(ra), aid)
                    self.atoms.setdefault(self.gb.key(rb), aid)

    # -- support ----------------------------------------------------------------------------
    def _supports(self, g, s):
        memo = {}
        intern = {}

        def origins(nd, depth=0):
            hit = memo.get(nd)
            if hit is not None:
                return hit
            row, preds, term = g.nodes[nd]
            scalar = row is not None and not len(g.shape(row))
            a = self.atom(s, row)
            if a is not None and g.key(row) not in self.computed:
                res = frozenset([("a", a)])
            elif a is not None:
                # computed on both sides: what computed it, unless that was constants
                # alone (an arange, an iota): then the value itself
                res = (g.support[term[1]] if term is not None and term[0] == "unit"
                       and g.support[term[1]] is not None else
                       _union([origins(q, depth + 1) for q in preds])) or frozenset([("a", a)])
            elif term is not None and term[0] == "unit":
                res = g.support[term[1]]
                if res is None:
                    res = frozenset([("l", s, nd)])
            elif term is not None and term[0] == "const":
                res = frozenset()
            elif term is not None or depth > MAX_DEPTH:
                # an input only this side has; 0-d ones (seeds, counters, hyper-parameters)
                # are parameters of the computation, not data
                res = frozenset() if scalar else frozenset([("l", s, nd)])
            else:   # moved bytes: where they came from (constants contribute nothing)
                res = _union([origins(q, depth + 1) for q in preds])
            res = intern.setdefault(res, res)
            memo[nd] = res
            return res

        budget = MAX_SUPPORT_ELEMENTS   # bounded work on a hostile trace: new sets only
        for k, u in enumerate(g.units):
            if budget <= 0:                # what is left stays unpaired (never wrong)
                g.support[k] = frozenset([("l", s, ("budget", k))])
                continue
            parts = [origins(nd) for _, _, nd in g.input_nodes(u)]
            sup = _union(parts)
            if sup not in intern:
                intern[sup] = sup
                budget -= len(sup)
            g.support[k] = intern[sup]


def _union(parts):
    parts = [p for p in parts if p]
    if not parts:
        return frozenset()
    big = max(parts, key=len)
    if all(p <= big for p in parts):
        return big
    return frozenset().union(*parts)


