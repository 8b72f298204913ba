"""Eager against compiled: which recorded value stands for an event of the compiled side
(the probe's value of a replayed op, else the compiled call's real output of it, also
through a same-order view, else the replayed value), and how the outputs of a
decomposition pair with the eager op's (by dtype and shape, several of one kind by
closeness of value). The part of `EagerCompiledDiffer` (`compiled.py`) that reads values.
"""

import numpy as np

from ...trace import schema
from ..differ import comparable

MAX_CLOSENESS_PAIRS = 64      # values of one dtype and shape paired by closeness, at most
# ops that hand on their input's elements in the same order: a compiled output taken
# through one of them is the value of the op before it (inductor fuses such views away)
SAME_ORDER = {"view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "clone", "contiguous",
              "squeeze", "unsqueeze", "flatten"}


class CompiledValues:
    """The values of an `EagerCompiledDiffer`'s units (see the module docstring)."""

    # -- which value stands for an event -------------------------------------------------------
    def _units(self, which):
        return self.ua if which == "a" else self.ub

    def best_row(self, which, e, slot=0):
        """(value row, origin name) that stands for output `slot` of event e: for a replayed
        op, the probe's value, else the compiled call's real output of that op, else the
        replayed value."""
        u = self._units(which)
        side = u.side
        row = side.value_row(e, slot)
        if not u.replay[e] or row is None or row["name"] < 0:
            return row, schema.ORIGIN_NAMES.get(int(side.trace.events[e]["origin"]), "")
        t = side.trace
        call = int(side.call[e])
        probe = self._probe_rows(which, call)
        out = self._call_outputs(which, call)
        # the op's own compiled value, else one handed on through a same-order view
        for m, r in [(e, row)] + self._view_chain(which, e, slot):
            name = t.string(r["name"]) if r["name"] >= 0 else None
            if name in probe:
                return probe[name], "probe"
            if name in out:
                return out[name], "compiled"
        return row, "replay"

    def _view_chain(self, which, e, slot):
        """[(event, row)] of the same-order views that read output `slot` of replayed op e,
        one after the other, in the same compiled call."""
        u = self._units(which)
        side = u.side
        t = side.trace
        views = self._views.get(which)
        if views is None:
            views = {}
            inp = t.inputs
            n = len(t.events)
            if len(inp):
                c, p = inp["event"].astype(np.int64), inp["producer"].astype(np.int64)
                ok = (c >= 0) & (c < n) & (p >= 0) & (p < n) & (inp["slot"] == 0)
                c, p, ps = c[ok], p[ok], inp["producer_slot"][ok].astype(np.int64)
                sel = u.replay[c] & u.replay[p]
                for ce, pe, pse in zip(c[sel].tolist(), p[sel].tolist(), ps[sel].tolist()):
                    op = t.string(t.events[ce]["op"])
                    base = op[6:].split(".", 1)[0] if op.startswith("aten::") else ""
                    if base in SAME_ORDER and side.call[ce] == side.call[pe]:
                        views.setdefault((pe, pse), ce)
            self._views[which] = views
        out = []
        key = (e, slot)
        while key in views and len(out) < 8:
            ce = views[key]
            row = side.value_row(ce, 0)
            if row is None:
                break
            out.append((ce, row))
            key = (ce, 0)
        return out

    def _call_outputs(self, which, call):
        key = (which, call)
        hit = self._call_rows.get(key)
        if hit is None:
            t = self._units(which).side.trace
            hit = {}
            if call >= 0:
                for r in t.value_rows(call, schema.ROLE_OUT):
                    if r["name"] >= 0:
                        hit.setdefault(t.string(r["name"]), r)
            self._call_rows[key] = hit
        return hit

    def _probe_rows(self, which, call):
        """{value name: row} of the probe eqns of a compiled call (empty when not probed)."""
        key = (which, call)
        hit = self._probe_of.get(key)
        if hit is None:
            side = self._units(which).side
            t = side.trace
            ev = t.events
            hit = {}
            if call >= 0:
                pcalls = np.flatnonzero((side.kind == schema.KIND_CALL) & (side.parent == call) &
                                        (ev["origin"] == schema.ORIGIN_PROBE))
                if len(pcalls):
                    eq = np.flatnonzero((side.call == int(pcalls[0])) & (side.kind == schema.KIND_EQN))
                    for e in eq.tolist():
                        for r in t.value_rows(e, schema.ROLE_OUT):
                            if r["name"] >= 0 and comparable(r):
                                hit.setdefault(t.string(r["name"]), r)
            self._probe_of[key] = hit
        return hit

    # -- comparisons -------------------------------------------------------------------------
    def _unit_rows(self, which, k):
        """[(dtype, shape, row)] of the values unit k hands on (best values)."""
        u = self._units(which)
        t = u.side.trace
        out = []
        for e, sl in u.outputs[k]:
            own = u.side.value_row(e, sl)        # its shape names it, even when the value
            row, _ = self.best_row(which, e, sl)  # comes through a view of another shape
            out.append((t.string(own["dtype"]), t.string(own["shape"]), row) if own is not None
                       else (None, None, None))
        return out

    def output_map(self, ka, kb):
        """[(i, j)]: output i of unit ka of a is output j of unit kb of b. Values of one
        dtype and shape pair directly when each side has one; several (a layer norm's
        mean and rstd, a dropout's mask and scaled mask) pair by closeness of value."""
        key = (ka, kb)
        hit = self._out_map.get(key)
        if hit is not None:
            return hit
        ra, rb = self._unit_rows("a", ka), self._unit_rows("b", kb)
        groups = {}
        for i, (d_, s_, _) in enumerate(ra):
            if d_ is not None:
                groups.setdefault((d_, s_), ([], []))[0].append(i)
        for j, (d_, s_, _) in enumerate(rb):
            if (d_, s_) in groups:
                groups[(d_, s_)][1].append(j)
        hit = []
        for ia, ib in groups.values():
            if len(ia) == 1 and len(ib) == 1:
                hit.append((ia[0], ib[0]))
                continue
            if len(ia) * len(ib) > MAX_CLOSENESS_PAIRS:   # bounded work: in order
                hit.extend(zip(ia, ib))
                continue
            cand = sorted((self._distance(ra[i][2], rb[j][2]), x, y, i, j)
                          for x, i in enumerate(ia) for y, j in enumerate(ib))
            used_i, used_j = set(), set()
            for _, _, _, i, j in cand:
                if i not in used_i and j not in used_j:
                    used_i.add(i)
                    used_j.add(j)
                    hit.append((i, j))
        hit.sort()
        self._out_map[key] = hit
        return hit

    def _distance(self, row_a, row_b):
        """Relative mean distance of two values (0 when their hashes agree; inf when either
        was not stored), to pair values of one dtype and shape."""
        if row_a is None or row_b is None or not comparable(row_a) or not comparable(row_b):
            return float("inf")
        if int(row_a["hash"]) == int(row_b["hash"]):
            return 0.0
        try:
            xa = np.asarray(self.ra.read(row_a)).astype(np.float64)
            xb = np.asarray(self.rb.read(row_b)).astype(np.float64)
        except (TypeError, ValueError):
            return float("inf")
        if xa.size != xb.size:
            return float("inf")
        xb = xb.reshape(xa.shape)   # a value taken through a same-order view
        with np.errstate(all="ignore"):
            num = float(np.nanmean(np.abs(xa - xb))) if xa.size else 0.0
            den = float(np.nanmean(np.abs(xa)) + np.nanmean(np.abs(xb))) if xa.size else 0.0
        d = num / den if den > 0 else num
        return d if d == d else float("inf")

    def cross_outputs(self, side, e):
        """For explain's replay verdict: the values a decomposition hands on, in the slot
        order of the eager op it is paired with (None where unpaired); None when event e
        of `side` is not a decomposition paired with an eager op."""
        if side != self.compiled_side:
            return None
        other = int(self.al.b2a[e] if side == "b" else self.al.a2b[e])
        if other < 0:
            return None
        ea, eb = (other, e) if side == "b" else (e, other)
        if not self._is_cross(ea, eb):
            return None
        ka, kb = int(self.ua.unit_of[ea]), int(self.ub.unit_of[eb])
        n_eager = len((self.ua if side == "b" else self.ub).outputs[ka if side == "b" else kb])
        out = [None] * n_eager
        rows = self._unit_rows(side, kb if side == "b" else ka)
        reader = self.rb if side == "b" else self.ra
        for i, j in self.output_map(ka, kb):
            eager_i, mine = (i, j) if side == "b" else (j, i)
            row = rows[mine][2]
            if row is not None and comparable(row):
                out[eager_i] = reader.read(row)
        return out

    def _value_origin(self, ea, eb):
        which = self.compiled_side
        u = self._units(which)
        e = eb if which == "b" else ea
        k = int(u.unit_of[e])
        found = [self.best_row(which, m, sl)[1] for m, sl in u.outputs[k]]
        for o in ("replay", "compiled", "probe"):
            if o in found:
                return o
        return found[0] if found else ""
