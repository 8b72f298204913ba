"""Eager against compiled: align a PyTorch run with a torch.compile run of the same script.

The eager trace holds one event per aten op as the program ran it. The compiled trace
holds, for each compiled graph call, a `call` event and the call's aten graph replayed op
by op (`eqn`, origin `replay`), after AOT autograd's decompositions: one eager
`aten::native_layer_norm` is seven replayed ops there (`var_mean`, `add`, `rsqrt`, ...),
each naming the op it was decomposed from (the `node` column) and that op's autograd
sequence number (`iter`). So the compiled side is read as *units*:

* replayed ops of one call with the same (original op, sequence number, module path,
  source line), consecutive: one unit standing for that original op; its value is the
  output of its last op (the decomposition's result);
* compiled call events are dropped (their ops stand for them), probe events too;
* everything else (eager ops outside compiled regions, optimizer snapshots, inputs) is
  one unit each, as on the eager side.

Ops are paired by the same anchored Myers diff as two runs of one framework, over
signatures of (phase, op or original op, module path, first output dtype and shape);
optimizer snapshots anchor the regions.

The value compared for a unit of the compiled side is the best one recorded, in order:
the probe's value of its last op (`record --probe`: inductor's own compiled
intermediate), the compiled call's real output of that op when the graph returns it
(saved activations, results), else the replayed value. A finding says which (`origin`).
Its inputs are the values the unit reads from outside itself, paired in order with the
eager op's inputs (by dtype and shape when the counts differ).
"""

import numpy as np

from ...trace import schema
from ..align import sequence as _align
from ..differ import BITWISE, TOLERANCE, Differ, comparable
from .compiled_values import CompiledValues

CROSS = "decomposition"
MAX_GAP_RUN_PAIRS = 10_000    # run pairs tried in one gap between paired units


def compiled_calls(trace):
    """Number of torch.compile call events (origin compiled) in a trace."""
    ev = trace.events
    return int(np.count_nonzero((ev["framework"] == schema.FW_TORCH) &
                                (ev["kind"] == schema.KIND_CALL) &
                                (ev["origin"] == schema.ORIGIN_COMPILED)))


def is_eager_vs_compiled(ta, tb):
    """True when both traces are torch-only and exactly one holds compiled calls."""
    for t in (ta, tb):
        fws = set(np.unique(t.events["framework"]).tolist()) - {0}
        if fws and fws != {schema.FW_TORCH}:
            return False
    return (compiled_calls(ta) > 0) != (compiled_calls(tb) > 0)


class _Units:
    """One side read as units (see the module docstring)."""

    def __init__(self, side):
        t = side.trace
        ev = t.events
        n = len(ev)
        self.side = side
        kind = side.kind
        origin = ev["origin"].astype(np.int64)
        fw = ev["framework"].astype(np.int64)
        node, ns, src = ev["node"].astype(np.int64), ev["name_stack"].astype(np.int64), \
            ev["source"].astype(np.int64)
        it, call, phase = ev["iter"].astype(np.int64), side.call, ev["phase"].astype(np.int64)
        replay = (kind == schema.KIND_EQN) & (origin == schema.ORIGIN_REPLAY) & (fw == schema.FW_TORCH)
        self.skip = (origin == schema.ORIGIN_PROBE) | \
            ((kind == schema.KIND_CALL) & (origin == schema.ORIGIN_COMPILED) & (fw == schema.FW_TORCH))
        n_str = len(t.strings)

        def gid(col):   # string ids shared by both traces (align.StringIds)
            return side.gid[np.where((col >= 0) & (col < n_str), col, -1)]

        self.key = np.stack([phase, gid(ns), gid(src)], axis=1) if n else np.zeros((0, 3), np.int64)
        self.replay = replay
        self.call = call
        # replayed ops of one call that come from one op: same original op and autograd
        # sequence number; an op traced without a sequence number joins the next op of
        # the same origin that has one (decompositions interleave their helpers)
        seq = it.copy()
        idx = np.flatnonzero(replay)
        # without autograd (no_grad, inference graphs) every forward op of a graph carries
        # the same sequence number: there it says nothing, and ops group only when
        # consecutive (a backward graph's ops share their forward op's number by design)
        fwd = replay & (phase == schema.PHASE_FWD) & (seq >= 0)
        origins = {}
        for e in np.flatnonzero(fwd).tolist():
            origins.setdefault((int(call[e]), int(seq[e])), set()).add(int(node[e]))
        for e in np.flatnonzero(fwd).tolist():
            if len(origins[(int(call[e]), int(seq[e]))]) > 3:
                seq[e] = -1
        nxt = {}
        for e in idx[::-1].tolist():
            k = (int(call[e]), int(node[e]), int(phase[e]))
            if seq[e] < 0 and k in nxt:
                seq[e] = nxt[k]
            elif seq[e] >= 0:
                nxt[k] = int(seq[e])
        groups, members = {}, []
        for e in range(n):
            if self.skip[e]:
                continue
            if replay[e] and seq[e] >= 0:
                k = (int(call[e]), int(node[e]), int(seq[e]), int(phase[e]), int(ns[e]), int(src[e]))
                g = groups.get(k)
                if g is None:
                    g = groups[k] = len(members)
                    members.append([])
                members[g].append(e)
            elif replay[e] and members and members[-1] and replay[members[-1][-1]] and \
                    seq[members[-1][-1]] < 0 and call[members[-1][-1]] == call[e] and \
                    (node[members[-1][-1]], ns[members[-1][-1]], src[members[-1][-1]],
                     phase[members[-1][-1]]) == (node[e], ns[e], src[e], phase[e]):
                members[-1].append(e)        # consecutive ops of one origin, no sequence nr
            else:
                members.append([e])
        members.sort(key=lambda m: m[-1])   # units in the order their results appear
        self.sig = None
        self._build(members)

    def _build(self, members):
        side = self.side
        n = len(side.trace.events)
        self.members = members
        self.reps = np.asarray([m[-1] for m in members], np.int64)
        self.unit_of = np.full(n, -1, np.int64)
        for k, m in enumerate(members):
            self.unit_of[m] = k
        self.kind = side.kind[self.reps] if len(self.reps) else np.zeros(0, np.int64)
        self.multi = np.array([len(m) > 1 for m in members], bool)
        self.outputs = self._outputs(side, self.replay, side.call)

    def merge(self, runs):
        """Merge runs of consecutive units ([(first unit, last unit)]) into one unit each;
        returns old unit index -> new unit index."""
        starts = {a: b for a, b in runs}
        members, remap, k = [], np.full(len(self.members), -1, np.int64), 0
        while k < len(self.members):
            last = starts.get(k, k)
            members.append(sorted(e for j in range(k, last + 1) for e in self.members[j]))
            remap[k:last + 1] = len(members) - 1
            k = last + 1
        self._build(members)
        return remap

    def _outputs(self, side, replay, call):
        """Per unit, the (event, slot) values it hands on, in order: every output of a
        single event; for several ops (a decomposition, or eager ops paired with one
        compiled op), the values read outside them (by a later op, or returned by the
        compiled call: saved activations, results)."""
        t = side.trace
        n = len(t.events)
        unit_of = self.unit_of
        leaving = set()
        inp = t.inputs
        if len(inp):
            p, c = inp["producer"].astype(np.int64), inp["event"].astype(np.int64)
            ok = (p >= 0) & (p < n) & (c >= 0) & (c < n)
            p, c, ps = p[ok], c[ok], inp["producer_slot"][ok].astype(np.int64)
            m = (unit_of[p] >= 0) & (unit_of[p] != unit_of[c])
            leaving.update(zip(p[m].tolist(), ps[m].tolist()))
        vals = t.values
        out_rows = vals[(vals["role"] == schema.ROLE_OUT)]
        ev = out_rows["event"].astype(np.int64)
        okv = (ev >= 0) & (ev < n)
        out_rows, ev = out_rows[okv], ev[okv]
        returned = {}
        for c in np.unique(call[ev[replay[ev]]]).tolist() if len(ev) else []:
            if 0 <= c < n:
                returned[c] = {t.string(r["name"]) for r in t.value_rows(c, schema.ROLE_OUT)
                               if r["name"] >= 0}
        for r, e in zip(out_rows[replay[ev]], ev[replay[ev]].tolist()):
            if r["name"] >= 0 and t.string(r["name"]) in returned.get(int(call[e]), ()):
                leaving.add((e, int(r["slot"])))
        slots = {}
        for e, sl in zip(ev.tolist(), out_rows["slot"].astype(np.int64).tolist()):
            slots.setdefault(e, []).append(sl)
        outs = []
        for m in self.members:
            if len(m) == 1 and not replay[m[0]]:
                outs.append([(m[0], sl) for sl in sorted(slots.get(m[0], ()))])
                continue
            mine = sorted((e, sl) for e in m for sl in slots.get(e, ()) if (e, sl) in leaving)
            outs.append(mine or [(m[-1], 0)])
        return outs

    def forward_units(self):
        """Per unit: the unit of the forward op a backward unit belongs to, else -1."""
        side = self.side
        ev = side.trace.events
        n = len(ev)
        out = np.full(len(self.reps), -1, np.int64)
        phase = ev["phase"].astype(np.int64)
        it = ev["iter"].astype(np.int64)
        by_seq = {}
        for k, m in enumerate(self.members):
            for e in m:
                if self.replay[e] and phase[e] == schema.PHASE_FWD and it[e] >= 0:
                    by_seq.setdefault((int(self.call[e]), int(it[e])), k)
        for k, rep in enumerate(self.reps.tolist()):
            if phase[rep] != schema.PHASE_BWD:
                continue
            if self.replay[rep]:
                c = int(self.call[rep])
                fwd_call = int(side.parent[c]) if 0 <= c < n else -1
                out[k] = by_seq.get((fwd_call, int(it[rep])), -1)
            elif side.kind[rep] == schema.KIND_OP:
                p = int(side.parent[rep])
                out[k] = self.unit_of[p] if 0 <= p < n else -1
        return out

    def runs(self, units):
        """Split consecutive unit indices into runs of equal (phase, module, line), each in
        one compiled call (or none)."""
        out = []
        for k in units:
            e = self.members[k][-1]
            key = (tuple(self.key[e]), int(self.call[e]) if self.replay[e] else -1)
            if out and key == out[-1][2]:
                out[-1][1] = k
            else:
                out.append([k, k, key])
        return [(a, b, key[0]) for a, b, key in out]

    def signatures(self, side):
        """Unit signatures: ops by (phase, op or the op it was decomposed from, module,
        first output dtype/shape); other units keep their event signature."""
        t = side.trace
        ev = t.events
        gid = side.gid
        n_str = len(t.strings)

        def g(col):
            col = np.asarray(col, np.int64)
            return gid[np.where((col >= 0) & (col < n_str), col, -1)]

        reps = self.reps
        if not len(reps):
            return
        kinds = side.kind[reps]
        is_op = (kinds == schema.KIND_OP) | self.replay[reps]
        op_col = np.where(self.replay[reps], ev["node"][reps], ev["op"][reps])
        keys = side.key(reps, schema.ROLE_OUT, 0)
        pos = np.minimum(np.searchsorted(side.vkey, keys), max(len(side.vkey) - 1, 0))
        found = (side.vkey[pos] == keys) if len(side.vkey) else np.zeros(len(reps), bool)
        rows = t.values[side.vrow[pos]] if len(side.vkey) else None
        dt = np.where(found, g(rows["dtype"]), -2) if rows is not None else np.full(len(reps), -2)
        sh = np.where(found, g(rows["shape"]), -2) if rows is not None else np.full(len(reps), -2)
        op_sig = _align.mix(np.full(len(reps), schema.FW_TORCH), np.full(len(reps), schema.KIND_OP),
                            g(op_col), g(ev["name_stack"][reps]), ev["phase"][reps].astype(np.int64),
                            dt, sh)
        self.sig = np.where(is_op, op_sig, side.sig[reps])
        self.is_op = is_op


class _UnitAlignment(_align.Alignment):
    """Event-level pairs of unit representatives; counts and gaps are of units (a
    decomposition's inner ops and the compiled call events are not 'missing')."""

    units = None

    def stats(self):
        out = super().stats()
        ua, ub, ual = self.units
        matched = int((ual.a2b >= 0).sum())
        out.update(matched=matched, only_in_a=len(ua.reps) - matched,
                   only_in_b=len(ub.reps) - matched, units_a=len(ua.reps), units_b=len(ub.reps),
                   paired_as="eager vs torch.compile: compiled calls read as their replayed ops, "
                             "a decomposition as the one eager op it stands for")
        return out

    def gaps(self, limit=5):
        ua, ub, ual = self.units
        return [{"side": side, "start": int(u.members[start][0]), "length": length}
                for side, u, arr in (("a", ua, ual.a2b), ("b", ub, ual.b2a))
                for start, length in _align.unmatched_runs(arr, limit)]


class EagerCompiledDiffer(CompiledValues, Differ):
    """A `Differ` for an eager trace against a torch.compile trace of the same script; which
    value stands for an event, and how a decomposition's outputs pair with the eager op's,
    are in `compiled_values.py`."""

    def __init__(self, ta, tb, rtol=None, atol=None):
        strings = _align.StringIds()
        sa, sb = _align.prepare(ta, strings), _align.prepare(tb, strings)
        self.ua, self.ub = _Units(sa), _Units(sb)
        self.ua.signatures(sa)
        self.ub.signatures(sb)
        ual = _align.align(self.ua, self.ub)
        if self._key_backward(ual):
            ual = _align.align(self.ua, self.ub)
        ual = self._pair_gaps(ual)
        self.ual = ual
        a2b = np.full(len(ta), -1, np.int64)
        b2a = np.full(len(tb), -1, np.int64)
        ia = np.flatnonzero(ual.a2b >= 0)
        ea, eb = self.ua.reps[ia], self.ub.reps[ual.a2b[ia]]
        a2b[ea], b2a[eb] = eb, ea
        al = _UnitAlignment(a2b, b2a, ual.fallback_regions, ual.anchors_matched)
        al.units = (self.ua, self.ub, ual)
        super().__init__(ta, tb, rtol, atol, alignment=al, sides=(sa, sb))
        self._call_rows = {}
        self._probe_of = {}
        self._out_map = {}
        self._views = {}
        self.compiled_side = "b" if compiled_calls(tb) else "a"
        for e in ea.tolist():
            self.pair_by[e] = CROSS if self._is_cross(e, int(a2b[e])) else "structure"

    def _key_backward(self, ual):
        """Backward ops run in a different order eagerly (the autograd engine) and compiled
        (the backward graph), and many look alike (`t`, `mm`, `view` of one module): key
        each by the forward op it belongs to (its parent eagerly; the forward op with its
        autograd sequence number when compiled), through the forward pairs just found.
        Returns True when any signature changed (align again)."""
        fa, fb = self.ua.forward_units(), self.ub.forward_units()
        xb = np.where(fb >= 0, ual.b2a[np.maximum(fb, 0)], -1)
        changed = False
        for u, x in ((self.ua, fa), (self.ub, xb)):
            sel = x >= 0
            if sel.any():
                u.sig = np.where(sel, _align.mix(u.sig, x + 1), u.sig)
                changed = True
        return changed

    def _pair_gaps(self, ual):
        """Between two paired units, eager ops left over on one side and replayed ops left
        over on the other, at the same module path and source line, are one op written two
        ways (eager `dropout` = empty_like, bernoulli_, div_, mul; compiled
        `native_dropout`): merge each such run into one unit and pair them."""
        ua, ub = self.ua, self.ub
        pa = np.flatnonzero(ual.a2b >= 0)
        bounds = list(zip(pa.tolist(), ual.a2b[pa].tolist())) + [(len(ua.reps), len(ub.reps))]
        runs_a, runs_b, pairs = [], [], []
        prev_i = prev_j = -1
        for i, j in bounds:
            if i - prev_i > 1 and j - prev_j > 1:
                ra = ua.runs(range(prev_i + 1, i))
                rb = ub.runs(range(prev_j + 1, j))
                if len(ra) * len(rb) > MAX_GAP_RUN_PAIRS:   # bounded work (untrusted traces)
                    prev_i, prev_j = i, j
                    continue
                used = 0
                for a0, a1, key in ra:
                    for x in range(used, len(rb)):
                        b0, b1, kb = rb[x]
                        rep_a = any(ua.replay[ua.reps[k]] for k in range(a0, a1 + 1))
                        rep_b = any(ub.replay[ub.reps[k]] for k in range(b0, b1 + 1))
                        if kb == key and rep_a != rep_b and \
                                self._run_shape(ua, a1) == self._run_shape(ub, b1):
                            runs_a.append((a0, a1))
                            runs_b.append((b0, b1))
                            pairs.append((a0, b0))
                            used = x + 1
                            break
            prev_i, prev_j = i, j
        if not pairs:
            return ual
        old_a2b = ual.a2b
        ma, mb = ua.merge(runs_a), ub.merge(runs_b)
        a2b = np.full(len(ua.reps), -1, np.int64)
        b2a = np.full(len(ub.reps), -1, np.int64)
        for i in np.flatnonzero(old_a2b >= 0).tolist():
            a2b[ma[i]], b2a[mb[old_a2b[i]]] = mb[old_a2b[i]], ma[i]
        for i, j in pairs:
            a2b[ma[i]], b2a[mb[j]] = mb[j], ma[i]
        return _align.Alignment(a2b, b2a, ual.fallback_regions, ual.anchors_matched)

    @staticmethod
    def _run_shape(u, k):
        """The first output's shape of unit k's last event: two runs stand for one op
        written two ways only when what they end in has one shape (an eager
        `native_layer_norm_backward` + the residual's `add` at one line ends in the
        activation's gradient, a decomposition of the backward alone in a bias's)."""
        row = u.side.value_row(int(u.reps[k]), 0)
        return None if row is None else u.side.trace.string(row["shape"])

    def _is_cross(self, ea, eb):
        """Does this pair stand for one op written two ways (a decomposition, or several
        eager ops against one compiled op)?"""
        return bool(self.ua.replay[ea] or self.ub.replay[eb] or
                    self.ua.multi[self.ua.unit_of[ea]] or self.ub.multi[self.ub.unit_of[eb]])

    def transform_b(self, row_a, row_b, xa, xb):
        """A value taken through a same-order view has the view's shape: compare it in
        the shape of the op it stands for (same elements, same order)."""
        xa, xb = np.asarray(xa), np.asarray(xb)
        if xa.shape != xb.shape and xa.size == xb.size:
            return xb.reshape(xa.shape)
        return xb

    def _out_pairs(self, ea, eb):
        if not self._is_cross(ea, eb):
            return super()._out_pairs(ea, eb)
        # an eager op against a decomposition: the values each hands on, paired by
        # dtype and shape in order (native_layer_norm's out, mean, rstd against the
        # decomposition's add, var_mean[1], rsqrt)
        ka, kb = int(self.ua.unit_of[ea]), int(self.ub.unit_of[eb])
        ra, rb = self._unit_rows("a", ka), self._unit_rows("b", kb)
        return [(i, ra[i][2], rb[j][2]) for i, j in self.output_map(ka, kb)]

    def _externals(self, which, e):
        """[(producer unit, output index in it, producer event)] a unit reads from
        outside itself, in order of first use."""
        u = self._units(which)
        t = u.side.trace
        n = len(t.events)
        k = int(u.unit_of[e])
        mine = u.members[k] if k >= 0 else [e]
        out, seen = [], set()
        for m in mine:
            for r in t.input_rows(m):
                p, ps = int(r["producer"]), int(r["producer_slot"])
                if p < 0 or p >= n or (k >= 0 and u.unit_of[p] == k) or (p, ps) in seen:
                    continue
                seen.add((p, ps))
                kp = int(u.unit_of[p])
                idx = u.outputs[kp].index((p, ps)) if kp >= 0 and (p, ps) in u.outputs[kp] else -1
                out.append((kp, idx, p))
        return out

    def judges_inputs_bitwise(self, ea, eb):
        return not self._is_cross(ea, eb)   # a decomposition reads what the graph computed

    def inputs_match(self, ea, eb, level):
        """For an eager op against a decomposition: each value the unit reads from outside
        is matched with the eager op's input from the paired producer (through the
        alignment and the producers' output pairing), then compared. Values computed
        inside the compiled graph with no eager counterpart (recomputed activations) are
        not compared."""
        if not self._is_cross(ea, eb):
            return super().inputs_match(ea, eb, level)
        xa, xb = self._externals("a", ea), self._externals("b", eb)
        by_b = {}
        for kb, jb, pb in xb:
            by_b.setdefault(kb, []).append((jb, pb))
        bad, checked, unmatched = [], 0, 0
        rows_a_cache = {}
        for slot, (ka, ia, pa) in enumerate(xa):
            kb = int(self.ual.a2b[ka]) if ka >= 0 else -1
            cand = by_b.get(kb, [])
            jb = dict(self.output_map(ka, kb)).get(ia) if kb >= 0 and ia >= 0 else None
            hit = next((c for c in cand if c[0] == jb), None) if jb is not None else None
            if hit is None:
                unmatched += 1
                continue
            if ka not in rows_a_cache:
                rows_a_cache[ka] = self._unit_rows("a", ka)
            row_a = rows_a_cache[ka][ia][2]
            row_b = self._unit_rows("b", kb)[hit[0]][2]
            m = self.compare_rows(row_a, row_b) if row_a is not None and row_b is not None else None
            if m is None:
                unmatched += 1
                continue
            checked += 1
            if not (m["bitwise_equal"] if level == BITWISE else m["within_tolerance"]):
                bad.append({"input": slot, "metrics": m, "producer_a": pa, "producer_b": hit[1],
                            "producer_op": self.ta.string(self.ta.events[pa]["op"])})
        word = "bitwise" if level == BITWISE else "within tolerance"
        extra = (f"; {unmatched} value(s) read from outside the op have no counterpart in the "
                 f"other run (computed inside the compiled graph) and were not compared"
                 if unmatched else "")
        if bad:
            return False, (f"{len(bad)} of its inputs differ "
                           f"{'bitwise' if level == BITWISE else 'beyond tolerance'}"), bad
        if not checked:
            return None, ("no input of the op could be paired with the other run's"
                          + extra), []
        return True, (f"its input matches ({word})" if checked == 1 else
                      f"all {checked} inputs match ({word})") + extra, []

    def input_pairs(self, ea, eb):
        """For an eager op against a decomposition: the values the unit reads from outside,
        paired as `inputs_match` pairs them (None rows where one has no counterpart)."""
        if not self._is_cross(ea, eb):
            return super().input_pairs(ea, eb)
        by_b = {}
        for kb, jb, pb in self._externals("b", eb):
            by_b.setdefault(kb, []).append((jb, pb))
        out = []
        for slot, (ka, ia, _) in enumerate(self._externals("a", ea)):
            kb = int(self.ual.a2b[ka]) if ka >= 0 else -1
            jb = dict(self.output_map(ka, kb)).get(ia) if kb >= 0 and ia >= 0 else None
            hit = next((c for c in by_b.get(kb, []) if c[0] == jb), None) \
                if jb is not None else None
            row_a = self._unit_rows("a", ka)[ia][2] if ka >= 0 and ia >= 0 else None
            out.append((slot, row_a, None if hit is None else self._unit_rows("b", kb)[hit[0]][2]))
        return out

    def _equal_hashes(self, ea, eb):
        """Every paired value has the same hash (and dtype, shape): bitwise equal, cheaply."""
        pairs = self._out_pairs(ea, eb)
        if not pairs:
            return False
        for _, ra, rb in pairs:
            if ra is None or rb is None or not (comparable(ra) and comparable(rb)) or \
                    int(ra["hash"]) != int(rb["hash"]) or \
                    self.ta.string(ra["dtype"]) != self.tb.string(rb["dtype"]) or \
                    self.ta.string(ra["shape"]) != self.tb.string(rb["shape"]):
                return False
        return True

    def search(self, level):
        """First paired unit (in the order of a) whose value differs at `level`."""
        ia, ib = self.pairs()
        phase = f"comparing differing events ({level})"
        self._tell(phase, 0, len(ia))
        for i, (ea, eb) in enumerate(zip(ia.tolist(), ib.tolist())):
            if not i & 1023:
                self._tell(phase, i, len(ia))
            if self._is_cross(ea, eb):
                if self._equal_hashes(ea, eb):
                    continue
            elif self.sa.content[ea] == self.sb.content[eb]:
                continue
            if self.equal_at(ea, eb, level) or self._is_noise(ea):
                continue
            if level == TOLERANCE and self.near_zero(ea, eb):
                continue   # rounding noise around zero (compare/nearzero.py)
            return self.finding(ea, eb, level), None
        return None, None

    def finding(self, ea, eb, level, note=""):
        f = super().finding(ea, eb, level, note)
        if not self._is_cross(ea, eb):
            return f
        which = self.compiled_side
        e = eb if which == "b" else ea
        u = self._units(which)
        t = u.side.trace
        k = int(u.unit_of[e])
        mine = u.members[k]
        orig = t.string(t.events[e]["node"]) or t.string(t.events[e]["op"])
        call = int(u.side.call[e])
        call_op = t.string(t.events[call]["op"]) if call >= 0 else ""
        ops = ", ".join(t.string(t.events[m]["op"]).replace("aten::", "") for m in mine)
        where = f"events {mine[0]}-{mine[-1]}" if mine[-1] - mine[0] == len(mine) - 1 else \
            "events " + ", ".join(str(m) for m in mine[:8]) + (" ..." if len(mine) > 8 else "")
        f.origin = self._value_origin(ea, eb)
        f.pair_by = CROSS
        kinds = {"probe": "the probe's compiled value (inductor's own intermediate)",
                 "compiled": "the compiled call's real output",
                 "replay": "replayed"}
        by = {}
        ka, kb = int(self.ua.unit_of[ea]), int(self.ub.unit_of[eb])
        for i, j in self.output_map(ka, kb):
            m, sl = u.outputs[kb if which == "b" else ka][j if which == "b" else i]
            row, o = self.best_row(which, m, sl)
            name = t.string(row["name"]) if row is not None and row["name"] >= 0 else f"#{m}"
            by.setdefault(kinds.get(o, o), []).append(f"output {i} ({name})")
        values = "; ".join(f"{', '.join(v)}: {k_}" for k_, v in by.items())
        f.note = (f"{which}: torch.compile's {orig} is {len(mine)} op(s) of compiled call "
                  f"{call_op!r} #{call} ({where}: {ops[:120]}), paired with the eager "
                  f"op; {which}'s values: {values}")
        if f.origin == "replay":
            f.note += ("; a replayed value is the decomposition run op by op, not inductor's "
                       "fused kernel: record the compiled run with --probe to compare inductor's "
                       "own intermediate")
        return f
