"""The comparison engine: two aligned traces, their values compared event by event.

`Differ` holds both traces, their alignment (`align/sequence.py`) and cached comparisons; it
answers "are these outputs equal (bitwise / within tolerance)?", "do this event's
inputs match?" and searches the first divergence in the order of trace a (the rules are
in `locate.py`'s docstring). `cross.CrossDiffer` is the same engine for traces of two
frameworks. Everything that builds on comparisons (locate, explain, chain, profile)
imports from here; this module imports none of them.
"""

import dataclasses
import math

import numpy as np

from ..trace import schema
from ..trace.blob import ValueReader
from ..trace.values import has_bytes, parse_shape
from .align import sequence as _align
from .compare import args as _args
from .compare import values as compare
from .compare import devices as _devices
from .compare import nearzero as _nearzero
from .compare import dtypes as _dtypes
from .align import optroles
from .compare import levels as _levels
from .result import (CallRef, EventRef, Finding, Metrics, OptimizerStep, ValueComparison,
                     ValueDesc)

BITWISE, TOLERANCE = compare.BITWISE, compare.TOLERANCE   # re-exported: callers take them from here


comparable = has_bytes   # a value whose numbers can be compared


def input_value_row(side, trace, ev, prod, pslot):
    """The value row an input slot read: producer output, or the call's role-IN value
    when an equation reads its enclosing call's argument."""
    if prod < 0 or prod >= len(trace.events):
        return None
    if side.kind[prod] == schema.KIND_CALL and side.call[ev] == prod:
        row = side.value_row(prod, pslot, schema.ROLE_IN)
        if row is not None:
            return row
    return side.value_row(prod, pslot, schema.ROLE_OUT)


class Differ:
    """The state of one comparison: both traces, their alignment, cached comparisons."""

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

    # -- values ----------------------------------------------------------------------------
    def compare_rows(self, row_a, row_b, tol_dtype=None):
        """Metrics of two value rows; None when either cannot be compared. `tol_dtype`:
        judge by the tolerance of this (less precise) dtype instead of the value's own."""
        if not comparable(row_a) or not comparable(row_b):
            # --level stats/calls: hash first, then statistics (compare/levels.py)
            if _levels.hashed(row_a) and _levels.hashed(row_b):
                return _levels.compare_hashed(self, row_a, row_b, tol_dtype)
            return self._compare_shards(row_a, row_b, tol_dtype)
        key = (int(row_a["offset"]), int(row_b["offset"]), int(row_a["nbytes"]), tol_dtype)
        hit = self._cmp_val.get(key)
        if hit is not None:
            return hit
        sa, sb = self.ta.string, self.tb.string
        da, db = sa(row_a["dtype"]), sb(row_b["dtype"])
        shape_a, shape_b = sa(row_a["shape"]), sb(row_b["shape"])
        if row_a["hash"] == row_b["hash"] and da == db and shape_a == shape_b:
            r, t = compare.tolerance(tol_dtype or da, self.rtol, self.atol)
            m = {"bitwise_equal": True, "within_tolerance": True, "max_abs": 0.0, "max_rel": 0.0,
                 "max_ulp": 0.0, "mismatch_fraction": 0.0, "beyond_tolerance_fraction": 0.0,
                 "rtol": r, "atol": t}
        else:
            xa, xb = self.ra.read(row_a), self.rb.read(row_b)
            xb_cmp = self.transform_b(row_a, row_b, xa, xb)
            m = compare.compare_arrays(xa, xb_cmp, da, self.rtol, self.atol, tol_dtype=tol_dtype,
                                       ulp=self.ulp)
            if da != db:
                m["dtype_mismatch"] = [da, db]
                m["within_tolerance"] = False if not compare.is_floating(da) else m["within_tolerance"]
                if _cast_only(xa, xb_cmp):
                    m["cast_only"] = True
            m["bitwise_equal"] = bool(da == db and xa.shape == np.asarray(xb_cmp).shape and
                                      np.asarray(xa).tobytes() == np.asarray(xb_cmp).tobytes())
            if m["bitwise_equal"]:
                m["within_tolerance"] = True
        self._cmp_val[key] = m
        return m

    def _compare_shards(self, row_a, row_b, tol_dtype=None):
        """Metrics of a value whose global bytes neither side stored, through the
        per-device shards both stored (a global array spread over several processes:
        each process records only its own shards), paired by device, index and replica;
        None when they do not pair up or a differing shard has no bytes."""
        skip = schema.VFLAG_UNINIT | schema.VFLAG_STATS
        if row_a is None or row_b is None or (int(row_a["flags"]) | int(row_b["flags"])) & skip:
            return None
        if not self.ta.has_devices() or not self.tb.has_devices():
            return None
        ident = (int(row_a["event"]), int(row_a["slot"]), int(row_a["role"]))
        key = ("shards",) + ident + (int(row_b["event"]), tol_dtype)
        if key in self._cmp_val:
            return self._cmp_val[key]
        da = self.ta.device_values(*ident)
        db = self.tb.device_values(int(row_b["event"]), int(row_b["slot"]), int(row_b["role"]))
        by_key = {(v.device, v.shard, v.replica): v for v in db}
        dtype = self.ta.string(row_a["dtype"])
        ms, m = [], None
        r, t = compare.tolerance(tol_dtype or dtype, self.rtol, self.atol)
        # shards rows only (each has a digest): a device-tied event's own unstored value
        # reads as one copy without a digest, and is not compared
        if da and len(da) == len(db) and all(v.digest for v in da + db) and \
                all((v.device, v.shard, v.replica) in by_key for v in da):
            for v in da:
                w = by_key[(v.device, v.shard, v.replica)]
                if v.digest and v.digest == w.digest:
                    ms.append({"bitwise_equal": True, "within_tolerance": True, "max_abs": 0.0,
                               "max_rel": 0.0, "max_ulp": 0.0, "mismatch_fraction": 0.0,
                               "beyond_tolerance_fraction": 0.0, "rtol": r, "atol": t})
                    continue
                xa, xb = v.value(), w.value()
                if xa is None or xb is None:   # digests only (--level stats): undecided
                    shape = self.ta.string(row_a["shape"])
                    one = _levels.stats_metrics(None, None, dtype, dtype, shape, shape, r, t)
                    one["note"] = ("this process's shards differ (digests; their bytes were "
                                   "not stored, --level full stores them)")
                    _levels._counts(self)["stats_undecided"] += 1
                    ms.append(one)
                    continue
                if xa.shape != xb.shape:
                    ms = None
                    break
                one = compare.compare_arrays(xa, xb, dtype, self.rtol, self.atol,
                                             tol_dtype=tol_dtype, ulp=self.ulp)
                one["bitwise_equal"] = xa.tobytes() == xb.tobytes()
                one["within_tolerance"] = one["within_tolerance"] or one["bitwise_equal"]
                ms.append(one)
            if ms:
                m = compare.worst(ms)
                m["bitwise_equal"] = all(x["bitwise_equal"] for x in ms)
                m["shards_only"] = len(ms)
        self._cmp_val[key] = m
        return m

    def transform_b(self, row_a, row_b, xa, xb):
        """Hook for cross-framework comparison (e.g. a transposed weight); identity here."""
        return xb

    def _out_pairs(self, ea, eb):
        """[(key, row_a, row_b)] of the output values of two paired events."""
        ra = self.ta.value_rows(ea, schema.ROLE_OUT)
        rb = self.tb.value_rows(eb, schema.ROLE_OUT)
        return _pair_rows(self.ta, self.tb, ra, rb, by_name=self.sa.kind[ea] == schema.KIND_OPTIM)

    def compare_event(self, ea, eb):
        """Outputs of a paired event: {'bitwise_equal', 'within_tolerance', 'values',
        'metrics', 'compared', 'not_compared'}."""
        key = (ea, eb)
        hit = self._cmp.get(key)
        if hit is not None:
            return hit
        vals, ms, not_compared = [], [], 0
        weak = self._weakest_input_dtype(ea)
        for k, row_a, row_b in self._out_pairs(ea, eb):
            tol_dtype = None
            if weak is not None and row_a is not None:
                own = self.ta.string(row_a["dtype"])
                if compare.is_floating(own) and \
                        compare.tolerance(weak)[0] > compare.tolerance(own)[0]:
                    tol_dtype = weak
            m = self.compare_rows(row_a, row_b, tol_dtype) \
                if row_a is not None and row_b is not None else None
            entry = {"key": k,
                     "a": _vdesc(self.ta, row_a), "b": _vdesc(self.tb, row_b)}
            if m is None:
                not_compared += 1
                entry["compared"] = False
            else:
                entry["compared"] = True
                entry["metrics"] = m
                ms.append(m)
            vals.append(entry)
        bit = all(m["bitwise_equal"] for m in ms)
        tol = all(m["within_tolerance"] for m in ms)
        diff_ms = [m for m in ms if not m["bitwise_equal"]]
        res = {"bitwise_equal": bit, "within_tolerance": tol, "values": vals,
               "metrics": compare.worst(diff_ms or ms) if ms else None,
               "compared": len(ms), "not_compared": not_compared}
        self._cmp[key] = res
        return res

    def _weakest_input_dtype(self, ea):
        """The least precise floating dtype among the values event `ea` of a reads: an
        output cannot be held to a tighter tolerance than its inputs (a float32 value
        converted to float64 keeps its float32 error)."""
        names = set()
        for row in self.ta.value_rows(ea, schema.ROLE_IN):
            names.add(self.ta.string(row["dtype"]))
        for r in self.ta.input_rows(ea):
            p = int(r["producer"])
            if 0 <= p < len(self.ta.events):
                row = input_value_row(self.sa, self.ta, ea, p, int(r["producer_slot"]))
                if row is not None:
                    names.add(self.ta.string(row["dtype"]))
        names = [n for n in names if compare.is_floating(n)]
        if not names:
            return None
        return max(names, key=lambda n: compare.tolerance(n)[0])

    def _read_through_cast(self, p, ps, q, qs):
        """"float32 -> bfloat16" when one side's producer (p of a, q of b) is a dtype or
        layout conversion that only that side ran (`align.TRANSPARENT_OPS`, unpaired) and
        what it converted is bitwise the value the other side read; else None."""
        for side, s, t, own, ev, slot, other, oslot in (
                ("b", self.sb, self.tb, self.al.b2a, q, qs, p, ps),
                ("a", self.sa, self.ta, self.al.a2b, p, ps, q, qs)):
            if ev < 0 or ev >= len(own) or own[ev] >= 0 or other < 0 or \
                    getattr(s, "transparent", None) is None or not s.transparent[ev]:
                continue
            rows = [r for r in t.input_rows(ev) if int(r["slot"]) == 0]
            if not rows or int(rows[0]["producer"]) < 0:
                continue
            src, src_slot = int(rows[0]["producer"]), int(rows[0]["producer_slot"])
            mine, theirs = (self.sb, self.sa) if side == "b" else (self.sa, self.sb)
            row_o = theirs.value_row(other, oslot)
            row_s, row_c = mine.value_row(src, src_slot), mine.value_row(ev, slot)
            ta_, tb_ = (row_o, row_s) if side == "b" else (row_s, row_o)
            if ta_ is None or tb_ is None or row_c is None:
                continue
            m = self.compare_rows(ta_, tb_)
            if m is None or not m["bitwise_equal"]:
                continue
            before, after = t.string(row_s["dtype"]), t.string(row_c["dtype"])
            return f"{before} -> {after}" if before != after else f"{before}, {t.string(t.events[ev]['op'])}"
        return None

    def cast_only(self, ea, eb):
        """True when the paired outputs differ in dtype and each differing one is exactly
        the other side's value converted to its dtype (a view or copy of a cast input):
        the precision changed, no op computed differently yet (`_cast_only`)."""
        if self.sa.n_out[ea] == 0 or self.sa.content[ea] == self.sb.content[eb]:
            return False
        r = self.compare_event(ea, eb)
        ms = [v["metrics"] for v in r["values"] if v.get("compared")]
        differing = [m for m in ms if not m["bitwise_equal"]]
        return bool(differing) and len(ms) == len(r["values"]) and \
            all(m.get("cast_only") for m in differing)

    def equal_at(self, ea, eb, level):
        r = self.compare_event(ea, eb)
        return r["bitwise_equal"] if level == BITWISE else r["within_tolerance"]

    # -- inputs ----------------------------------------------------------------------------
    def inputs_match(self, ea, eb, level):
        """(True/False/None, reason, [mismatching input descriptions])."""
        bad, unknown = [], []
        checked = 0
        # role-IN values stored on the event itself (a call's arguments, an equation's
        # literals); a slot that also has a dataflow edge is judged by the edge, with the
        # role-IN values as the fallback when the producer's value was not stored
        ina = self.ta.value_rows(ea, schema.ROLE_IN)
        inb = self.tb.value_rows(eb, schema.ROLE_IN)
        own = {k: (row_a, row_b) for k, row_a, row_b in
               _pair_rows(self.ta, self.tb, ina, inb, by_name=False)}
        edges = {int(r["slot"]) for r in self.ta.input_rows(ea) if int(r["producer"]) >= 0}

        casts = []

        def judge(key, m, extra):
            nonlocal checked
            checked += 1
            if m.get("cast_only"):   # the same value in another dtype: a cast, not a difference
                casts.append(f"{key} ({m['dtype_mismatch'][0]} -> {m['dtype_mismatch'][1]})")
                return
            if not (m["bitwise_equal"] if level == BITWISE else m["within_tolerance"]):
                bad.append(dict(extra, input=key, metrics=m))

        def own_value(k):
            """Judge slot k by the values stored on the event; False when it cannot."""
            row_a, row_b = own.get(k, (None, None))
            m = self.compare_rows(row_a, row_b) if row_a is not None and row_b is not None \
                else None
            if m is not None:
                judge(str(k), m, {})
            return m is not None

        for k, (row_a, row_b) in own.items():
            if k in edges:
                continue
            if row_a is None or row_b is None:
                unknown.append(f"input {k} is recorded on one side only")
            elif not own_value(k):
                unknown.append(f"input {k} was not stored")
        # dataflow edges
        rows_a = self.ta.input_rows(ea)
        # a slot has several rows when an event reads one value per device (a collective
        # replayed per device, capture/jax_devices.py): paired in order
        rows_b, seen_b = {}, {}
        for r in self.tb.input_rows(eb):
            k = int(r["slot"])
            rows_b[(k, seen_b.get(k, 0))] = r
            seen_b[k] = seen_b.get(k, 0) + 1
        seen_a = {}
        for r in rows_a:
            slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
            nth = seen_a.get(slot, 0)
            seen_a[slot] = nth + 1
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            if p == schema.PRODUCER_UNKNOWN:
                if slot not in own:
                    unknown.append(f"input {slot} has an unknown producer")
                continue
            rb = rows_b.get((slot, nth))
            q, qs = (int(rb["producer"]), int(rb["producer_slot"])) if rb is not None else (-1, 0)
            va = input_value_row(self.sa, self.ta, ea, p, ps)
            vb = input_value_row(self.sb, self.tb, eb, q, qs) if q >= 0 else None
            cast = self._read_through_cast(p, ps, q, qs)
            if cast is not None:   # one side casts what both read: a cast, not a difference
                casts.append(f"{slot} ({cast})")
                checked += 1
                continue
            m = self.compare_rows(va, vb) if va is not None and vb is not None else None
            if m is None:
                if own_value(slot):
                    continue
                unknown.append(f"input {slot} has no counterpart in b" if rb is None else
                               f"input {slot} comes from event {p} in a but has no producer "
                               f"in b" if q < 0 else f"input {slot} (from event {p}) was not stored")
                continue
            judge(slot, m, {"producer_a": p, "producer_b": q,
                            "producer_op": self.ta.string(self.ta.events[p]["op"])})
        if bad:
            return False, (f"{len(bad)} of its inputs differ "
                           f"{'bitwise' if level == BITWISE else 'beyond tolerance'}"), bad
        if unknown:
            return None, "; ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else ""), []
        if checked == 0:
            return True, "it reads no recorded inputs", []
        if casts:
            return True, (f"its inputs match up to a dtype cast of input "
                          f"{', '.join(casts[:3])}{' ...' if len(casts) > 3 else ''}"), []
        return True, (f"its input matches ({_level_word(level)})" if checked == 1 else
                      f"all {checked} inputs match ({_level_word(level)})"), []

    # -- search ----------------------------------------------------------------------------
    def pairs(self):
        ia = np.flatnonzero(self.al.a2b >= 0)
        return ia, self.al.a2b[ia]

    def candidate_pairs(self):
        """Paired events whose output content hashes differ, in the order of trace a."""
        ia, ib = self.pairs()
        diff = self.sa.content[ia] != self.sb.content[ib]
        return ia[diff], ib[diff]

    def _origin_among(self, events_a, level, depth=0):
        """First origin (inputs match, outputs differ) among these a-events; prefers the
        inner equations of a nested jit origin. Returns (ea, eb, first_diff)."""
        first_diff = None
        for ea in events_a:
            eb = int(self.al.a2b[ea])
            if eb < 0 or self.sa.content[ea] == self.sb.content[eb]:
                continue
            if self.equal_at(ea, eb, level):
                continue
            if self._is_noise(ea):
                continue
            if first_diff is None:
                first_diff = (ea, eb)
            ok, _, bad = self.inputs_match(ea, eb, level)
            if not ok and bad and self.sa.kind[ea] == schema.KIND_EQN and \
                    all("producer_a" not in b for b in bad):
                ok = True   # only its literal constants differ: the program changed here
            if ok:
                kids = np.flatnonzero((self.sa.parent == ea) & (self.sa.kind == schema.KIND_EQN))
                if len(kids) and depth < 16:
                    inner, _, _ = self._origin_among(kids, level, depth + 1)
                    if inner is not None:
                        return inner, first_diff, True
                return (ea, eb), first_diff, True
        return None, first_diff, False

    FAST_CHUNK_BYTES = 8 << 20   # per side; the float64 temporaries of a chunk whose every
                                 # element differs take ~17x this (kept well under 1 GB)
    FAST_MAX_BYTES = 1 << 20

    def _fast_within_tolerance(self, ia, ib):
        """Vectorised pre-check of many candidate pairs: True where the pair is certainly
        within tolerance (one float output value on each side, same dtype and shape, every
        element within tolerance). Everything else is left to the exact per-event path."""
        if not len(ia) or self.ulp is not None:
            return np.zeros(len(ia), bool)
        done, _, beyond = self.scan_single_outputs(ia, ib, self.FAST_MAX_BYTES,
                                                   self.FAST_CHUNK_BYTES, progress=True)
        return done & ~beyond

    SCAN_DTYPES = ("float64", "float32", "float16", "complex128", "complex64")

    def scan_single_outputs(self, ia, ib, max_bytes, chunk_bytes, progress=False):
        """(done, max_rel, beyond) per pair of (ia, ib), vectorised in chunks: for pairs with
        one float/complex output on each side (same dtype and shape, bytes stored, at most
        `max_bytes`) the max relative difference (`compare/values.py`'s, inf for NaN against a
        number) and whether an element is beyond rtol/atol (not --ulp); `done` False for
        every other pair (the caller's exact per-event path). The one implementation of the
        scan (locate's tolerance pre-check and the HTML profile both use it); only the
        elements whose bits differ are measured."""
        n = len(ia)
        done, beyond = np.zeros(n, bool), np.zeros(n, bool)
        max_rel = np.zeros(n, np.float64)
        sa, sb = self.sa, self.sb
        if not n:
            return done, max_rel, beyond
        simple = (sa.n_out[ia] == 1) & (sb.n_out[ib] == 1) & (sa.kind[ia] != schema.KIND_OPTIM)
        sel = np.flatnonzero(simple)
        if not len(sel):
            return done, max_rel, beyond

        def rows(side, ev):
            keys = side.key(ev, schema.ROLE_OUT, 0)
            pos = np.minimum(np.searchsorted(side.vkey, keys), max(len(side.vkey) - 1, 0))
            found = side.vkey[pos] == keys
            return side.trace.values[side.vrow[pos]], found

        va, fa = rows(sa, ia[sel])
        vb, fb = rows(sb, ib[sel])
        bad_flags = schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED
        good = fa & fb & (va["offset"] >= 0) & (vb["offset"] >= 0) & \
            ((va["flags"] & bad_flags) == 0) & ((vb["flags"] & bad_flags) == 0) & \
            (sa.gid[va["dtype"]] == sb.gid[vb["dtype"]]) & (sa.gid[va["shape"]] == sb.gid[vb["shape"]]) & \
            (va["nbytes"] == vb["nbytes"]) & (va["nbytes"] > 0) & (va["nbytes"] <= max_bytes)
        dnames = _resolve(self.ta, va["dtype"])
        snames = _resolve(self.ta, va["storage"])
        todo, finished = int(va["nbytes"][good].sum()), 0
        for dt in self.SCAN_DTYPES:
            idx = np.flatnonzero(good & (dnames == dt) & (snames == dt))
            if not len(idx):
                continue
            r, t = compare.tolerance(dt, self.rtol, self.atol)
            item = np.dtype(dt).itemsize
            parts = 2 if dt.startswith("complex") else 1
            ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[item // parts]
            start = 0
            while start < len(idx):
                nb = va["nbytes"][idx[start:]].astype(np.int64)
                stop = start + max(1, int(np.searchsorted(np.cumsum(nb), chunk_bytes)))
                part = idx[start:stop]
                ra_ = self.ra.gather(va["offset"][part], va["nbytes"][part])
                rb_ = self.rb.gather(vb["offset"][part], vb["nbytes"][part])
                xa, xb = ra_.view(dt), rb_.view(dt)
                # only elements whose bits differ are measured (one cheap pass)
                neq = ra_.view(ut) != rb_.view(ut)
                if parts == 2:
                    neq = neq.reshape(-1, 2).any(axis=1)
                nz = np.flatnonzero(neq)
                wide = np.complex128 if parts == 2 else np.float64
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    pa, pb = xa[nz].astype(wide), xb[nz].astype(wide)
                    nan_a, nan_b = np.isnan(pa), np.isnan(pb)
                    equal = (pa == pb) | (nan_a & nan_b)
                    diff = np.abs(pa - pb)
                    scale = np.maximum(np.abs(pa), np.abs(pb))
                    rel = np.where(equal, 0.0, diff / np.where(scale == 0, 1.0, scale))
                    rel = np.where(np.isnan(rel) | (nan_a ^ nan_b), np.inf, rel)
                    out = ~equal & ~(np.isfinite(diff) & (diff <= t + r * scale))
                seg = np.concatenate([[0], np.cumsum(va["nbytes"][part].astype(np.int64) // item)[:-1]])
                k = sel[part]
                full = np.zeros(len(xa), np.float64)
                full[nz] = rel
                max_rel[k] = np.maximum.reduceat(full, seg)
                out_k = np.zeros(len(part), bool)
                out_k[np.searchsorted(seg, nz[out], side="right") - 1] = True
                beyond[k], done[k] = out_k, True
                start = stop
                finished += int(va["nbytes"][part].sum())
                if progress:
                    self._tell("comparing values within tolerance (bytes)", finished, todo)
        return done, max_rel, beyond

    def search(self, level):
        """(Finding or None, replay-only Finding or None) for one level.

        The candidates (paired events whose content differs) are visited in the order of
        trace a; each goes to the handler of its kind (`SEARCH_BY_KIND`, the rules of
        `locate.py`), which returns the finding, or None to go on."""
        ia, ib = self.candidate_pairs()
        if level == TOLERANCE:
            keep = ~self._fast_within_tolerance(ia, ib)
            ia, ib = ia[keep], ib[keep]
        state = _Search(level, self.ta.events["origin"] == schema.ORIGIN_PROBE)
        phase = f"comparing differing events ({level})"
        self._tell(phase, 0, len(ia))
        for i, (ea, eb) in enumerate(zip(ia.tolist(), ib.tolist())):
            if not i & 1023:
                self._tell(phase, i, len(ia))
            if state.probe[ea]:
                continue  # tracediff's own extra program: searched only through its call
            if self.noisy is not None and self._is_noise(ea):
                continue
            if self.cast_only(ea, eb):
                continue  # only the dtype changed (a cast): not where values part
            handler = self.SEARCH_BY_KIND.get(int(self.sa.kind[ea]), Differ._search_event)
            found = handler(self, ea, eb, state)
            if found is not None:
                return found, state.replay_only
        return None, state.replay_only

    def _search_event(self, ea, eb, s):
        """What the script saw (eager primitive, torch op, optimizer snapshot, input):
        reported as is when it differs (beyond tolerance: unless it is rounding noise
        around zero, `near_zero`)."""
        if self.equal_at(ea, eb, s.level):
            return None
        if s.level == TOLERANCE and self.near_zero(ea, eb):
            return None
        return self.finding(ea, eb, s.level)

    near_zero_state = None   # nearzero.NearZero of the tolerance search

    def near_zero(self, ea, eb):
        """True (and remembered) when paired event ea, beyond tolerance, is rounding noise
        around zero (`nearzero.judge`): skipped by the tolerance search, shown apart."""
        if self.near_zero_state is None:
            self.near_zero_state = _nearzero.NearZero()
        st = self.near_zero_state
        try:
            why = _nearzero.judge(self, ea, eb, self.input_pairs(ea, eb))
        except (ValueError, TypeError):   # odd values: judged as they are
            why = None
        if why is None:
            return False
        st.count += 1
        if st.first is None:
            st.first = (int(ea), int(eb), why)
        return True

    def input_pairs(self, ea, eb):
        """[(slot, row_a, row_b)] of the dataflow inputs of two paired events (the
        values `inputs_match` compares; None rows where a side has none)."""
        rows_b = {}
        for r in self.tb.input_rows(eb):
            rows_b.setdefault(int(r["slot"]), r)
        out = []
        for r in self.ta.input_rows(ea):
            slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            rb = rows_b.get(slot)
            if p < 0 or rb is None or int(rb["producer"]) < 0:
                out.append((slot, None, None))
                continue
            out.append((slot, input_value_row(self.sa, self.ta, ea, p, ps),
                        input_value_row(self.sb, self.tb, eb, int(rb["producer"]),
                                        int(rb["producer_slot"]))))
        return out

    def _search_eqn(self, ea, eb, s):
        """A replayed equation: judged through its compiled call. Its call differing, it
        was resolved there (the call comes first); the call matching, it is replay-only
        (kept for information at the tolerance level, never the verdict)."""
        level = s.level
        c = int(self.sa.call[ea])
        cb = int(self.al.a2b[c]) if c >= 0 else -1
        if cb < 0:
            if self.equal_at(ea, eb, level):
                return None
            # no compiled counterpart to judge by (the calls are structured differently
            # in the two runs): the replayed values are the best evidence there is; a
            # nested jit whose inputs match is searched for its inner origin
            inner, _, _ = self._origin_among(np.array([ea]), level)
            ea, eb = inner if inner is not None else (ea, eb)
            return self.finding(ea, eb, level, note=(
                "replayed equation; its enclosing compiled call has no counterpart in b, "
                "so the replayed values are compared"))
        if not self.equal_at(c, cb, level):
            return None  # resolved through its call (cannot happen: the call comes first)
        if level != BITWISE and s.replay_only is not None:
            return None  # only the first replay-only difference is kept: nothing to measure
        if self.equal_at(ea, eb, level):
            return None
        dev = self.ta.event_device(ea) if self.ta.has_devices() else ""
        if dev and dev in self._departed_copies(c, cb, level):
            # the call's global value (one replica) matches, but its copy on this
            # equation's device does not: the script saw it there
            return self.finding(ea, eb, level, note=(
                f"the compiled outputs of the enclosing call (event {c}) match as global "
                f"values, but their copy on {dev} differs: that device departed"))
        note = (f"replay-only: the compiled outputs of the enclosing call (event {c}) "
                f"match{' bitwise' if level == BITWISE else ' within tolerance'}; "
                f"the script did not see this difference")
        f = self.finding(ea, eb, level, note=note)
        if level == BITWISE:
            return f
        if s.replay_only is None:
            s.replay_only = f
        return None

    def _departed_copies(self, ca, cb, level):
        """The devices whose per-device copy of call ca's outputs differs from b's copy
        (same device, shard and replica) at `level`, though the global values match."""
        key = (ca, cb, level)
        cache = self._departed_cache
        if key not in cache:
            out = set()
            if self.tb.has_devices():
                slots = sorted({int(r["slot"]) for r in self.ta.value_rows(ca, schema.ROLE_OUT)})
                for slot in slots:
                    da, db = self.ta.device_values(ca, slot), self.tb.device_values(cb, slot)
                    by_key = {(v.device, v.shard, v.replica): v for v in db}
                    for v in da:
                        w = by_key.get((v.device, v.shard, v.replica))
                        if w is None or not v.digest or v.digest == w.digest:
                            continue
                        if level == BITWISE:
                            out.add(v.device)
                            continue
                        xa, xb = v.value(), w.value()
                        m = compare.compare_arrays(xa, xb, str(xa.dtype), self.rtol, self.atol,
                                                   ulp=self.ulp)
                        if not m["within_tolerance"]:
                            out.add(v.device)
            cache[key] = out
        return cache[key]

    def _search_call(self, ea, eb, s):
        """A compiled call whose outputs differ: the first of its replayed equations that
        introduces the difference, else its compiled probe, else the call itself."""
        level = s.level
        if self.equal_at(ea, eb, level):
            return None
        eqns = np.flatnonzero((self.sa.call == ea) & (self.sa.kind == schema.KIND_EQN))
        # direct equations of the call (parent = the call, or unset); nested ones
        # are searched through their enclosing jit/cond/scan equation
        eqns = eqns[(self.sa.parent[eqns] == ea) | (self.sa.parent[eqns] < 0)]
        origin, first_diff, _ = self._origin_among(eqns, level)
        call = CallRef(a=ea, b=eb, op=self.ta.string(self.ta.events[ea]["op"]))
        if origin is not None:
            f = self.finding(*origin, level, note=(
                f"first replayed equation of compiled call {call.op!r} (event {ea}) "
                f"whose inputs match and whose outputs differ"))
            f.call = call
            return f
        if first_diff is not None:
            f = self.finding(*first_diff, level, note=(
                f"first differing replayed equation of compiled call {call.op!r} "
                f"(event {ea}); no equation inside it was found to introduce the "
                f"difference on its own"))
            f.call = call
            return f
        if len(eqns):
            f = self._probe_finding(ea, eb, call, level, s.probe)
            if f is not None:
                return f
        note = ("the compiled outputs differ but every replayed equation of this call "
                "matches: the divergence is inside the compiled program (fusion, "
                "compiler rewrites), not at any single equation"
                if len(eqns) else "the compiled outputs differ (no replayed equations "
                "recorded for this call)")
        f = self.finding(ea, eb, level, note=note)
        f.compiled = "replay matches" if len(eqns) else ""
        return f

    # the search's handler per event kind (every other kind: `_search_event`)
    SEARCH_BY_KIND = {schema.KIND_EQN: _search_eqn, schema.KIND_CALL: _search_call}

    def _probe_finding(self, ea, eb, call, level, probe):
        """A compiled call whose replayed equations all match: search its compiled probe
        (`record --probe`, capture/jax_probe.py), the same equations compiled with every
        intermediate as an output, for the first one whose compiled value differs while
        its inputs match. None when the call was not probed on both sides."""
        mine = np.flatnonzero(probe & (self.sa.kind == schema.KIND_CALL) & (self.sa.parent == ea))
        if not len(mine):
            return None
        pa = int(mine[0])
        pb = int(self.al.a2b[pa])
        if pb < 0:
            return None
        eqns = np.flatnonzero((self.sa.call == pa) & (self.sa.parent == pa) &
                              (self.sa.kind == schema.KIND_EQN))
        origin, first_diff, _ = self._origin_among(eqns, level)
        where = f"compiled call {call.op!r} (event {ea})"
        if origin is None and first_diff is None:
            note = ("the compiled outputs differ but every replayed equation matches, and the "
                    "compiled probe of the call (event {}) does not reproduce the difference: "
                    "it lies in how the whole program was fused".format(pa))
            if not self.equal_at(pa, pb, level):
                return None
            f = self.finding(ea, eb, level, note=note)
            f.compiled = "probe does not reproduce"
            return f
        if origin is not None:
            pick, how = origin, "whose inputs match and whose compiled value differs"
        else:
            pick, how = first_diff, "whose compiled value differs (none introduced it on its own)"
        f = self.finding(*pick, level, note=(
            f"every replayed equation of {where} matches; its compiled probe (event {pa}: the "
            f"call's equations compiled with each intermediate as an output) narrows the "
            f"difference to the first equation {how}"))
        f.call = dataclasses.replace(call, probe_a=pa, probe_b=pb)
        name = call.op[len("jit:"):]
        unfaithful = [side for side, t in (("a", self.ta), ("b", self.tb))
                      if name in ((((t.manifest.get("frameworks") or {}).get("jax") or {})
                                   .get("probe") or {}).get("differing_calls") or ())]
        if unfaithful:
            f.note += (f"; caveat: on {' and '.join(unfaithful)} the probe's final outputs are not "
                       f"bitwise those of the real program (the extra outputs changed fusion), so "
                       f"the real program may round elsewhere too")
        return f

    def _is_noise(self, ea):
        """True (and remembered) when event `ea` differs between two runs on a's machine."""
        if self.noisy is None or not self.noisy[ea]:
            return False
        if not isinstance(self.noise_skipped, set):
            self.noise_skipped = set()
        self.noise_skipped.add(int(ea))
        return True

    def finding(self, ea, eb, level, note=""):
        """The typed `Finding` of a paired event at one level."""
        r = self.compare_event(ea, eb)
        ok, reason, bad = self.inputs_match(ea, eb, level)
        if ok is False and bad:
            reason += ": " + ", ".join(
                f"input {d['input']}" + (f" from {d['producer_op']} (event {d['producer_a']})"
                                         if "producer_op" in d else "") for d in bad[:3])
        per_device, device_note = _devices.spread(self.ta, self.tb, ea, eb)
        ref_a, ref_b = _event(self.ta, ea, self.sa), _event(self.tb, eb, self.sb)
        return Finding(level=level, a=ref_a, b=ref_b,
                       metrics=Metrics.from_dict(r["metrics"]),
                       values=[_value_comparison(v) for v in r["values"]], inputs_match=ok,
                       inputs_reason=reason,
                       origin=schema.ORIGIN_NAMES.get(int(self.ta.events[ea]["origin"]), ""),
                       note=note, pair_by=self.pair_by.get(ea, "structure"),
                       devices=per_device, device_note=device_note,
                       optimizer=self._op_label(ea), arguments=self.arguments(ea, eb),
                       dtype_note=_dtypes.dtype_note(self.ta, self.tb, ea, eb, ref_a.dtypes,
                                                     ref_b.dtypes))

    def arguments(self, ea, eb):
        """The non-tensor arguments that differ between two paired events of one op
        (`args.differing`); [] across ops, kinds or frameworks (their arguments are not
        the same arguments)."""
        a, b = self.ta.events[ea], self.tb.events[eb]
        sa, sb = self.ta.string, self.tb.string
        if sa(a["op"]) != sb(b["op"]) or int(a["kind"]) != int(b["kind"]) or \
                int(a["framework"]) != int(b["framework"]):
            return []
        return _args.differing(sa(a["params"]), sb(b["params"]))

    def _op_label(self, ea):
        """optroles.op_label of an event of a (never fails a finding)."""
        try:
            cache = self.__dict__.setdefault("_op_labels", {})
            return optroles.op_label(self.ta, ea, cache)
        except Exception:   # an odd trace: no label
            return None

    # -- optimizer steps -------------------------------------------------------------------
    def optimizer_steps(self):
        ia, ib = self.pairs()
        sel = self.sa.kind[ia] == schema.KIND_OPTIM
        rows = []
        for ea, eb in zip(ia[sel].tolist(), ib[sel].tolist()):
            pairs = self._out_pairs(ea, eb)
            names = [p for p in pairs if str(p[0]).startswith("params/")] or pairs
            max_rel, max_abs, bit = 0.0, 0.0, True
            worst = (-1.0, None, None, None)   # (own rel L2, name, max abs, max rel)
            l2, read, same, by_rel = compare.RelL2(), False, [], None
            for k, row_a, row_b in names:
                if row_a is None or row_b is None:
                    continue
                m = self.compare_rows(row_a, row_b)
                if m is None:
                    continue
                read = True
                bit &= m["bitwise_equal"]
                rel, dabs = _worst_first(m.get("max_rel")), _worst_first(m.get("max_abs"))
                if not m["bitwise_equal"] and (by_rel is None or rel > max_rel):
                    by_rel = str(k)   # named when no differing tensor has bytes to compare
                max_rel, max_abs = max(max_rel, rel), max(max_abs, dabs)
                if not (comparable(row_a) and comparable(row_b)):
                    continue
                if m["bitwise_equal"]:   # only its ||a|| counts in the step's figure
                    same.append(row_a)
                    continue
                # ||a - b|| / ||a|| of this tensor, and summed into the step's figure
                xa, xb = self.ra.read(row_a), self.rb.read(row_b)
                xb = self.transform_b(row_a, row_b, xa, xb)
                own = compare.RelL2()
                own.add(xa, xb)
                l2.add(xa, xb)
                v = own.value()
                if v is not None and v > worst[0]:
                    worst = (v, str(k), dabs, rel)
            if not bit:
                for row_a in same:
                    xa = self.ra.read(row_a)
                    l2.add(xa, xa)
            rows.append(OptimizerStep(step=int(self.ta.events[ea]["step"]), a=ea, b=eb,
                                      bitwise_equal=bool(bit), max_rel=max_rel,
                                      max_abs=max_abs, worst=worst[1] or by_rel,
                                      rel_l2=l2.value() if read else None,
                                      worst_rel_l2=worst[0] if worst[1] is not None else None,
                                      worst_max_abs=worst[2]))
        return rows


class _Search:
    """The state of one `Differ.search`: its level, the probe events it skips, and the
    first replay-only difference met (the tolerance level keeps it for information)."""

    def __init__(self, level, probe):
        self.level, self.probe, self.replay_only = level, probe, None


def _cast_only(xa, xb):
    """True when float arrays xa and xb (different dtypes, same shape) are one value in two
    precisions: the more precise one converted to the other's dtype is the other, bitwise."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.shape != xb.shape or xa.dtype == xb.dtype or xa.dtype.kind not in "fV" or \
            xb.dtype.kind not in "fV":
        return False
    wide, narrow = (xa, xb) if xa.dtype.itemsize >= xb.dtype.itemsize else (xb, xa)
    try:
        with np.errstate(all="ignore"):
            return wide.astype(narrow.dtype).tobytes() == narrow.tobytes()
    except (TypeError, ValueError):
        return False


def _resolve(trace, idx):
    """Strings of many string-table indices (object array), one lookup per distinct index."""
    uniq, inv = np.unique(np.asarray(idx), return_inverse=True)
    return np.array([trace.string(u) for u in uniq.tolist()] or [""], dtype=object)[inv] \
        if len(uniq) else np.zeros(0, dtype=object)


def _worst_first(x):
    """A metric for ranking parameters: not computed counts as 0, NaN as the worst (inf)."""
    if x is None:
        return 0.0
    return math.inf if math.isnan(x) else float(x)


def _level_word(level):
    return "bitwise" if level == BITWISE else "within tolerance"


def _pair_rows(ta, tb, ra, rb, by_name):
    """Pair two lists of value rows by slot (or by name)."""
    if by_name:
        ka = [ta.string(r["name"]) if r["name"] >= 0 else f"#{int(r['slot'])}" for r in ra]
        kb = [tb.string(r["name"]) if r["name"] >= 0 else f"#{int(r['slot'])}" for r in rb]
    else:
        ka = [int(r["slot"]) for r in ra]
        kb = [int(r["slot"]) for r in rb]
    db = dict(zip(kb, rb))
    out = []
    seen = set()
    for k, r in zip(ka, ra):
        out.append((k, r, db.get(k)))
        seen.add(k)
    for k, r in zip(kb, rb):
        if k not in seen:
            out.append((k, None, r))
    return out


def _vdesc(t, row):
    if row is None:
        return None
    return {"slot": int(row["slot"]), "name": t.string(row["name"]) if row["name"] >= 0 else None,
            "dtype": t.string(row["dtype"]), "shape": list(parse_shape(t.string(row["shape"]))),
            "stored": bool(comparable(row)),
            "uninitialized": bool(row["flags"] & schema.VFLAG_UNINIT)}


def _event(t, eid, side):
    outs = t.value_rows(eid, schema.ROLE_OUT)
    return EventRef.from_event(t.event(eid),
                               shapes=[list(parse_shape(t.string(r["shape"]))) for r in outs],
                               dtypes=[t.string(r["dtype"]) for r in outs],
                               rank=getattr(t, "rank", None))


def _value_comparison(v):
    """The typed form of one entry of `compare_event`'s "values"."""
    return ValueComparison(key=v["key"], a=None if v["a"] is None else ValueDesc(**v["a"]),
                           b=None if v["b"] is None else ValueDesc(**v["b"]),
                           compared=v["compared"], metrics=Metrics.from_dict(v.get("metrics")))

