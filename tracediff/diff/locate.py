"""Locate the first divergence between two traces.

Two findings are reported, each as a `Finding`:

* `first_difference`: the first aligned event (in the order of trace a) whose outputs
  are not bitwise equal.
* `first_beyond_tolerance`: the first aligned event whose outputs differ beyond the
  tolerance (see `compare.py`). It decides the verdict and the exit code.

Rule for JAX compiled calls and replayed equations (the script saw the *compiled*
outputs of a `call`; its `eqn` events are an op-by-op replay from the call's real
inputs, which explains but is not what the script computed):

1. A `call` whose compiled outputs differ (at the level being searched) is resolved
   by descending into its replayed equations: the culprit is the first equation of
   that call whose inputs all match and whose outputs differ (the origin; when that
   equation is a nested `jit`, its own inner equations are searched the same way).
   If every replayed equation matches, the call itself is reported with the note that
   the divergence is inside the compiled program (fusion, compiler rewrites), not at
   any single equation.
2. A replayed equation that differs while the compiled outputs of its call match is a
   *replay-only* difference: the script never saw it. It can be the bitwise
   `first_difference` (marked `origin: replay` with a note saying the compiled outputs
   match), but it never decides the verdict: the tolerance search skips it and keeps
   the first such case in `replay_only` for information.
3. Every other kind (eager primitive, torch op, optimizer snapshot, input) is what the
   script saw and is reported as is.

The verdict is about values: events that have no counterpart (the two runs executed
different ops, or one trace is truncated) are counted in `alignment`, named in a warning,
and never compared; a run whose paired events all agree is a `match`.

"Introduced here" (`inputs_match: true`): every input the event read is equal (bitwise
for the bitwise finding, within tolerance for the tolerance finding). Inputs come from
role-IN values stored on the event itself (call events) and from the inputs table: the
producer's value in a is compared with the value b's matching input row points at.
Literals and closed-over constants count as equal; an unknown producer, a producer
whose value was not stored, or an input b does not have gives `inputs_match: null`
with the reason.
"""

import dataclasses
import os

import numpy as np

from ..errors import TraceError
from ..trace import schema
from ..trace.values import decode, parse_shape, _NATIVE
from . import align as _align
from . import compare
from . import levels as _levels
from .env import env_diff

BITWISE, TOLERANCE = "bitwise", "tolerance"
BLOB_IN_MEMORY = 256 << 20   # larger byte arenas are read value by value (bounded memory)
MAX_OPTIM_ROWS = 200


class ValueReader:
    """Reads stored values; keeps the whole byte arena in memory when it is small."""

    def __init__(self, trace):
        self.t = trace
        self.blob = None
        if trace.blob_size <= BLOB_IN_MEMORY:
            self.blob = trace._f["blob"][:trace.blob_size] if trace.blob_size else np.zeros(0, "u1")

    def gather(self, offsets, lengths):
        """Concatenated bytes of many stored values (offsets/lengths checked by the caller).
        Streams from the file when the arena is not in memory: one read of the slab that
        covers the values (they lie close together: a chunk of consecutive events), so
        memory stays bounded by the caller's chunk size."""
        if self.blob is not None:
            return _gather_slices(self.blob, offsets, lengths)
        lo = int(offsets.min())
        hi = int((offsets + lengths).max())
        if hi > self.t.blob_size:
            raise TraceError(f"{self.t.path}: value bytes lie outside the stored data")
        total = int(lengths.sum())
        if hi - lo <= 4 * total + (1 << 20):
            slab = self.t._f["blob"][lo:hi]
            return _gather_slices(slab, offsets - lo, lengths)
        ds = self.t._f["blob"]
        return np.concatenate([ds[int(o):int(o) + int(n)] for o, n in zip(offsets, lengths)]) \
            if len(offsets) else np.zeros(0, "u1")

    def read(self, row):
        if self.blob is None:
            return self.t.read_value(row)
        if row["offset"] < 0 or row["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT):
            return None
        s = self.t.string
        off, n = int(row["offset"]), int(row["nbytes"])
        if n < 0 or off + n > len(self.blob):
            raise TraceError(f"{self.t.path}: value bytes lie outside the stored data (truncated?)")
        storage = s(row["storage"])
        try:
            shape = parse_shape(s(row["shape"]))
        except ValueError as exc:
            raise TraceError(f"{self.t.path}: bad value shape ({exc})") from None
        if storage not in _NATIVE:
            raise TraceError(f"{self.t.path}: unknown storage dtype {storage!r}")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * np.dtype(storage).itemsize != n:
            raise TraceError(f"{self.t.path}: value size does not match its shape and dtype")
        return decode(self.blob[off:off + n].tobytes(), s(row["dtype"]), storage, shape)


def comparable(row):
    return row is not None and row["offset"] >= 0 and not (
        row["flags"] & (schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED))


@dataclasses.dataclass
class Finding:
    """One located divergence (a plain container; reports render it)."""

    level: str                 # "bitwise" or "tolerance"
    a: dict                    # event of trace a (index, op, name_stack, source, step, ...)
    b: dict
    metrics: dict              # worst over the event's differing values
    values: list               # per compared output value
    inputs_match: object       # True / False / None
    inputs_reason: str
    origin: str                # compiled / replay / eager / snapshot / ...
    note: str = ""
    call: dict = None          # enclosing compiled call {a, b, op} when descended into
    pair_by: str = "structure"
    # a compiled call found at the call itself: "replay matches" (every replayed equation
    # matches, no probe recorded), "probe does not reproduce" (its probe matches too)
    compiled: str = ""


@dataclasses.dataclass
class LocateResult:
    path_a: str
    path_b: str
    verdict: str
    first_difference: Finding
    first_beyond_tolerance: Finding
    replay_only: Finding
    alignment: dict
    gaps: list
    env_diff: list
    optimizer_steps: list
    warnings: list
    traces: dict
    tolerance: dict
    mapping: list = dataclasses.field(default_factory=list)
    optimizer_steps_total: int = 0
    explain: dict = None       # short replay verdict of the origin (explain.py), or None
    chain: list = None         # origin -> first beyond tolerance -> outputs (chain.py)
    noise: dict = None         # noise floor (--noise): nondeterministic events skipped
    levels: dict = None        # how each side was recorded, what was decided, zoom (levels.py)

    @property
    def exit_code(self):
        return 1 if self.verdict == "diverged" else 0

    def to_json(self):
        from ..report.json_report import build

        return build(self)


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
            # --level stats/calls: hash first, then statistics (levels.py)
            if _levels.hashed(row_a) and _levels.hashed(row_b):
                return _levels.compare_hashed(self, row_a, row_b, tol_dtype)
            return None
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
            m["bitwise_equal"] = bool(da == db and xa.shape == np.asarray(xb_cmp).shape and
                                      np.asarray(xa).tobytes() == np.asarray(xb_cmp).tobytes())
            if m["bitwise_equal"]:
                m["within_tolerance"] = True
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

        def judge(key, m, extra):
            nonlocal checked
            checked += 1
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
        rows_b = {int(r["slot"]): r for r in self.tb.input_rows(eb)}
        for r in rows_a:
            slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            if p == schema.PRODUCER_UNKNOWN:
                if slot not in own:
                    unknown.append(f"input {slot} has an unknown producer")
                continue
            rb = rows_b.get(slot)
            q, qs = (int(rb["producer"]), int(rb["producer_slot"])) if rb is not None else (-1, 0)
            va = input_value_row(self.sa, self.ta, ea, p, ps)
            vb = input_value_row(self.sb, self.tb, eb, q, qs) if q >= 0 else None
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
            ok, _, _ = self.inputs_match(ea, eb, level)
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
        ok = np.zeros(len(ia), bool)
        if not len(ia) or self.ulp is not None:
            return ok
        sa, sb = self.sa, self.sb
        simple = (sa.n_out[ia] == 1) & (sb.n_out[ib] == 1) & (sa.kind[ia] != schema.KIND_OPTIM)
        if not simple.any():
            return ok
        sel = np.flatnonzero(simple)

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
            (va["nbytes"] == vb["nbytes"]) & (va["nbytes"] > 0) & (va["nbytes"] <= self.FAST_MAX_BYTES)
        dnames = _resolve(self.ta, va["dtype"])
        snames = _resolve(self.ta, va["storage"])
        todo, done = int(va["nbytes"][good].sum()), 0
        for dt in ("float32", "float64", "float16"):
            m = good & (dnames == dt) & (snames == dt)
            idx = np.flatnonzero(m)
            if not len(idx):
                continue
            r, t = compare.tolerance(dt, self.rtol, self.atol)
            item = np.dtype(dt).itemsize
            start = 0
            while start < len(idx):
                nb = va["nbytes"][idx[start:]]
                stop = start + max(1, int(np.searchsorted(np.cumsum(nb), self.FAST_CHUNK_BYTES)))
                part = idx[start:stop]
                xa = self.ra.gather(va["offset"][part], va["nbytes"][part]).view(dt)
                xb = self.rb.gather(vb["offset"][part], vb["nbytes"][part]).view(dt)
                seg = np.concatenate([[0], np.cumsum(va["nbytes"][part] // item)[:-1]])
                # only elements whose bits differ need the tolerance test (one cheap pass)
                ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[item]
                nz = np.flatnonzero(xa.view(ut) != xb.view(ut))
                with np.errstate(invalid="ignore", over="ignore"):
                    fa64, fb64 = xa[nz].astype(np.float64), xb[nz].astype(np.float64)
                    diff = np.abs(fa64 - fb64)
                    within = (fa64 == fb64) | (np.isnan(fa64) & np.isnan(fb64)) | \
                        (np.isfinite(diff) & (diff <= t + r * np.maximum(np.abs(fa64), np.abs(fb64))))
                all_ok = np.ones(len(part), bool)
                all_ok[np.searchsorted(seg, nz[~within], side="right") - 1] = False
                ok[sel[part[all_ok]]] = True
                start = stop
                done += int(va["nbytes"][part].sum())
                self._tell("comparing values within tolerance (bytes)", done, todo)
        return ok

    def search(self, level):
        """(Finding or None, replay-only Finding or None) for one level."""
        ia, ib = self.candidate_pairs()
        if level == TOLERANCE:
            keep = ~self._fast_within_tolerance(ia, ib)
            ia, ib = ia[keep], ib[keep]
        replay_only = None
        probe = self.ta.events["origin"] == schema.ORIGIN_PROBE
        phase = f"comparing differing events ({level})"
        self._tell(phase, 0, len(ia))
        for i, (ea, eb) in enumerate(zip(ia.tolist(), ib.tolist())):
            if not i & 1023:
                self._tell(phase, i, len(ia))
            if probe[ea]:
                continue  # tracediff's own extra program: searched only through its call
            if self.noisy is not None and self._is_noise(ea):
                continue
            kind = int(self.sa.kind[ea])
            c = int(self.sa.call[ea]) if kind == schema.KIND_EQN else -1
            cb = int(self.al.a2b[c]) if c >= 0 else -1
            if kind == schema.KIND_EQN and cb < 0 and not self.equal_at(ea, eb, level):
                # no compiled counterpart to judge by (the calls are structured differently
                # in the two runs): the replayed values are the best evidence there is; a
                # nested jit whose inputs match is searched for its inner origin
                inner, _, _ = self._origin_among(np.array([ea]), level)
                ea, eb = inner if inner is not None else (ea, eb)
                return self.finding(ea, eb, level, note=(
                    "replayed equation; its enclosing compiled call has no counterpart in b, "
                    "so the replayed values are compared")), replay_only
            if kind == schema.KIND_EQN and cb >= 0:
                if not self.equal_at(c, cb, level):
                    continue  # resolved through its call (cannot happen: the call comes first)
                if self.equal_at(ea, eb, level):
                    continue
                note = (f"replay-only: the compiled outputs of the enclosing call (event {c}) "
                        f"match{' bitwise' if level == BITWISE else ' within tolerance'}; "
                        f"the script did not see this difference")
                f = self.finding(ea, eb, level, note=note)
                if level == BITWISE:
                    return f, None
                if replay_only is None:
                    replay_only = f
                continue
            if self.equal_at(ea, eb, level):
                continue
            if kind == schema.KIND_CALL:
                eqns = np.flatnonzero((self.sa.call == ea) & (self.sa.kind == schema.KIND_EQN))
                # direct equations of the call (parent = the call, or unset); nested ones
                # are searched through their enclosing jit/cond/scan equation
                eqns = eqns[(self.sa.parent[eqns] == ea) | (self.sa.parent[eqns] < 0)]
                origin, first_diff, _ = self._origin_among(eqns, level)
                call = {"a": ea, "b": eb, "op": self.ta.string(self.ta.events[ea]["op"])}
                if origin is not None:
                    f = self.finding(*origin, level, note=(
                        f"first replayed equation of compiled call {call['op']!r} (event {ea}) "
                        f"whose inputs match and whose outputs differ"))
                    f.call = call
                    return f, replay_only
                if first_diff is not None:
                    f = self.finding(*first_diff, level, note=(
                        f"first differing replayed equation of compiled call {call['op']!r} "
                        f"(event {ea}); no equation inside it was found to introduce the "
                        f"difference on its own"))
                    f.call = call
                    return f, replay_only
                if len(eqns):
                    f = self._probe_finding(ea, eb, call, level, probe)
                    if f is not None:
                        return f, replay_only
                note = ("the compiled outputs differ but every replayed equation of this call "
                        "matches: the divergence is inside the compiled program (fusion, "
                        "compiler rewrites), not at any single equation"
                        if len(eqns) else "the compiled outputs differ (no replayed equations "
                        "recorded for this call)")
                f = self.finding(ea, eb, level, note=note)
                f.compiled = "replay matches" if len(eqns) else ""
                return f, replay_only
            return self.finding(ea, eb, level), replay_only
        return None, replay_only

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
        where = f"compiled call {call['op']!r} (event {ea})"
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
        f.call = dict(call, probe_a=pa, probe_b=pb)
        name = call["op"][len("jit:"):]
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
        r = self.compare_event(ea, eb)
        ok, reason, bad = self.inputs_match(ea, eb, level)
        if ok is False and bad:
            reason += ": " + ", ".join(
                f"input {d['input']}" + (f" from {d['producer_op']} (event {d['producer_a']})"
                                         if "producer_op" in d else "") for d in bad[:3])
        return Finding(level=level, a=_event(self.ta, ea, self.sa), b=_event(self.tb, eb, self.sb),
                       metrics=r["metrics"] or {}, values=r["values"], inputs_match=ok,
                       inputs_reason=reason,
                       origin=schema.ORIGIN_NAMES.get(int(self.ta.events[ea]["origin"]), ""),
                       note=note, pair_by=self.pair_by.get(ea, "structure"))

    # -- optimizer steps -------------------------------------------------------------------
    def optimizer_steps(self):
        ia, ib = self.pairs()
        sel = self.sa.kind[ia] == schema.KIND_OPTIM
        rows = []
        for ea, eb in zip(ia[sel].tolist(), ib[sel].tolist()):
            pairs = self._out_pairs(ea, eb)
            names = [p for p in pairs if str(p[0]).startswith("params/")] or pairs
            worst_rel, worst_abs, worst_name, bit = 0.0, 0.0, None, True
            for k, row_a, row_b in names:
                if row_a is None or row_b is None:
                    continue
                m = self.compare_rows(row_a, row_b)
                if m is None:
                    continue
                bit &= m["bitwise_equal"]
                rel = _num(m.get("max_rel"))
                if rel > worst_rel or (worst_name is None and not m["bitwise_equal"]):
                    worst_rel, worst_abs, worst_name = rel, _num(m.get("max_abs")), str(k)
            rows.append({"step": int(self.ta.events[ea]["step"]), "a": ea, "b": eb,
                         "bitwise_equal": bool(bit), "max_rel": worst_rel, "max_abs": worst_abs,
                         "worst": worst_name})
        return rows


def _resolve(trace, idx):
    """Strings of many string-table indices (object array), one lookup per distinct index."""
    uniq, inv = np.unique(np.asarray(idx), return_inverse=True)
    return np.array([trace.string(u) for u in uniq.tolist()] or [""], dtype=object)[inv] \
        if len(uniq) else np.zeros(0, dtype=object)


def _gather_slices(buf, offsets, lengths):
    """Like `_gather`, faster and without per-byte index arrays (whose memory grows with 16x
    the bytes gathered): back-to-back values are one slice, values of >= 64 bytes on average
    are sliced and concatenated, only tiny ones go through `_gather`."""
    n = len(offsets)
    if not n:
        return np.zeros(0, "u1")
    offsets = offsets.astype(np.int64)
    ends = offsets + lengths.astype(np.int64)
    if n == 1 or (offsets[1:] == ends[:-1]).all():
        return buf[int(offsets[0]):int(ends[-1])]
    if int(lengths.sum()) >= 64 * n:
        return np.concatenate([buf[o:e] for o, e in zip(offsets.tolist(), ends.tolist())])
    return _gather(buf, offsets, lengths)


def _gather(blob, offsets, lengths):
    """Concatenated byte slices blob[o:o+n] for many (o, n), vectorised."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    starts = np.repeat(offsets.astype(np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                       lengths)
    return blob[starts + np.arange(total, dtype=np.int64)]


def _num(x):
    if x is None:
        return 0.0
    if isinstance(x, str):
        return float("inf")
    return float(x)


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
    d = t.event(eid)
    outs = t.value_rows(eid, schema.ROLE_OUT)
    d["shapes"] = [list(parse_shape(t.string(r["shape"]))) for r in outs]
    d["dtypes"] = [t.string(r["dtype"]) for r in outs]
    return d


def _script_warnings(ta, tb):
    w = []
    sa, sb = ta.manifest.get("script") or {}, tb.manifest.get("script") or {}
    sa, sb = (sa if isinstance(sa, dict) else {}), (sb if isinstance(sb, dict) else {})
    cross = _frameworks(ta) and _frameworks(tb) and _frameworks(ta) != _frameworks(tb)
    if sa.get("sha256") and sb.get("sha256") and sa.get("sha256") != sb.get("sha256") and not cross:
        same = sa.get("name") == sb.get("name")
        w.append(f"the traces come from different scripts ({sa.get('name')} sha256 "
                 f"{str(sa.get('sha256'))[:12]} vs {sb.get('name')} sha256 "
                 f"{str(sb.get('sha256'))[:12]}{'' if not same else ', same name, edited'}); "
                 f"comparing anyway")
    for t, name in ((ta, "a"), (tb, "b")):
        if not t.complete:
            w.append(f"trace {name} ({os.path.basename(t.path)}) is truncated: the recording did "
                     f"not finish; events after its end cannot be compared")
        end = t.manifest.get("end") or {}
        end = end if isinstance(end, dict) else {}
        if end.get("status") not in (None, "ok", "exit", "completed", "success") and \
                end.get("exit_code") not in (None, 0):
            w.append(f"trace {name}: the recorded script ended with {end.get('status')} "
                     f"(exit {end.get('exit_code')})")
    return w


def _frameworks(t):
    return set(np.unique(t.events["framework"]).tolist()) - {0}


def _trace_info(t):
    m = t.manifest
    return {"path": t.path, "complete": bool(t.complete), "events": int(len(t)),
            "script": (m.get("script") or {}).get("name"),
            "hostname": m.get("hostname"), "created": m.get("created")}


def run(ta, tb, rtol=None, atol=None, differ=None, mapping=None):
    """Compare two open traces; returns a `LocateResult`."""
    d = differ or Differ(ta, tb, rtol, atol)
    d.noise_skipped = set()
    first_bit, _ = d.search(BITWISE)
    first_tol, replay_only = d.search(TOLERANCE) if first_bit is not None else (None, None)
    steps = d.optimizer_steps()
    n_steps = len(steps)
    if len(steps) > MAX_OPTIM_ROWS:
        # keep it compact: the first steps, every step that got worse than all before,
        # and the last one
        kept, best = [], -1.0
        for i, r in enumerate(steps):
            if i < 20 or r["max_rel"] > best:
                kept.append(r)
            best = max(best, r["max_rel"])
        steps = kept[:MAX_OPTIM_ROWS - 1] + ([steps[-1]] if kept[-1] is not steps[-1] else [])
    warnings = _script_warnings(ta, tb)
    stats = d.al.stats()
    if not mapping and (stats["only_in_a"] or stats["only_in_b"]):
        gap = d.al.gaps(1)[0]
        t = ta if gap["side"] == "a" else tb
        ops = sorted({t.string(o) for o in t.events["op"][gap["start"]:gap["start"] + gap["length"]]})
        warnings.append(
            f"the event sequences differ: {stats['only_in_a']} events only in a, "
            f"{stats['only_in_b']} only in b (first: {gap['length']} events of {gap['side']} from "
            f"#{gap['start']}: {', '.join(ops[:5])}{' ...' if len(ops) > 5 else ''}); "
            f"only paired events are compared")
    result = LocateResult(
        path_a=ta.path, path_b=tb.path,
        verdict="diverged" if first_tol is not None else "match",
        first_difference=first_bit, first_beyond_tolerance=first_tol, replay_only=replay_only,
        alignment=d.al.stats(), gaps=d.al.gaps(), env_diff=env_diff(ta.manifest, tb.manifest),
        optimizer_steps=steps, warnings=warnings,
        traces={"a": _trace_info(ta), "b": _trace_info(tb)},
        tolerance={"rtol": rtol, "atol": atol, "defaults": {k: list(v) for k, v in
                                                              compare.DEFAULT_TOLERANCES.items()},
                   **({"ulp": d.ulp} if d.ulp is not None else {})},
        mapping=mapping or [], optimizer_steps_total=n_steps,
        noise=_noise_info(d))
    return _levels.annotate(result, ta, tb, d)


def _noise_info(d):
    if d.noisy is None:
        return None
    skipped = sorted(d.noise_skipped)
    return {"nondeterministic_events": int(np.count_nonzero(d.noisy)),
            "skipped": [{"index": e, "op": d.ta.string(d.ta.events[e]["op"])} for e in skipped[:20]],
            "skipped_total": len(skipped),
            "note": "ops whose outputs differ between the two --noise runs (recorded on one "
                    "machine) while their inputs are equal are nondeterministic there: they are "
                    "never blamed as the origin (what they cause downstream is inherited)"}


MAX_NOISE_CHECKS = 20000


def noise_mask(ta, n1, n2):
    """Bool per event of `ta`: its counterpart differs between noise traces n1 and n2."""
    dn = Differ(n1, n2)
    ia, ib = dn.pairs()
    diff = dn.sa.content[ia] != dn.sb.content[ib]
    # only the origins of the nondeterminism (their inputs are equal between the two runs):
    # what they cause downstream is not excused, it is reported as inherited
    bad = [e1 for e1, e2 in list(zip(ia[diff].tolist(), ib[diff].tolist()))[:MAX_NOISE_CHECKS]
           if dn.inputs_match(e1, e2, BITWISE)[0] is not False]
    bad = np.asarray(bad, np.int64)
    if n1 is ta or os.path.abspath(n1.path) == os.path.abspath(ta.path):
        to_a = np.arange(len(ta))
    else:
        strings = _align.StringIds()
        s1, sa = _align.prepare(n1, strings), _align.prepare(ta, strings)
        to_a = _align.align(s1, sa).a2b
    mask = np.zeros(len(ta), bool)
    hit = to_a[bad] if len(bad) else np.zeros(0, np.int64)
    mask[hit[hit >= 0]] = True
    return mask


def locate(a, b, rtol=None, atol=None, map_file=None, ulp=None, noise=None, explain=True,
           analysis=None, progress=None):
    """Python API: compare two trace files (paths or open `Trace` objects).

    Traces of different frameworks (or a `map_file`) go through the cross-framework
    pairing of `cross.py`. `ulp`: elements within this many ULP are within tolerance
    (alone, or in addition to rtol/atol when those are given). `noise`: two traces
    recorded on a's machine; events that differ between them are never blamed.
    `explain`: replay the origin and add the short verdict and the chain (`explain`,
    `chain`). `analysis`: a dict that receives the full `explain.analyse` output
    under "analysis" (for `tracediff explain`; the event to explain under "event").
    `progress(phase, done=None, total=None)`: called as the work goes (the CLI's bar)."""
    from ..trace.reader import Trace

    progress = progress or _no_progress

    if rtol is not None and (rtol < 0 or rtol != rtol):
        raise TraceError(f"invalid --rtol {rtol}")
    if atol is not None and (atol < 0 or atol != atol):
        raise TraceError(f"invalid --atol {atol}")
    if ulp is not None and (ulp < 0 or ulp != ulp):
        raise TraceError(f"invalid --ulp {ulp}")
    own = []
    try:
        ta = a if isinstance(a, Trace) else Trace(a)
        if ta is not a:
            own.append(ta)
        tb = b if isinstance(b, Trace) else Trace(b)
        if tb is not b:
            own.append(tb)
        fw_a, fw_b = _frameworks(ta), _frameworks(tb)
        progress("aligning the event sequences")
        try:
            mapping = None
            if map_file is not None or (fw_a and fw_b and fw_a != fw_b):
                from .cross import cross_differ

                d, mapping = cross_differ(ta, tb, rtol, atol, map_file)
            else:
                d = Differ(ta, tb, rtol, atol)
            d.ulp = ulp
            d.progress = progress
            if noise:
                n1, n2 = (x if isinstance(x, Trace) else Trace(x) for x in noise)
                own += [x for x, y in zip((n1, n2), noise) if x is not y]
                d.noisy = noise_mask(ta, n1, n2)
            result = run(ta, tb, rtol, atol, differ=d, mapping=mapping)
            if explain or analysis is not None:
                progress("explaining: replaying the origin op")
                _attach_explain(result, d, analysis)
            return result
        except (ValueError, IndexError, KeyError, OSError) as exc:
            # damaged tables (bad shapes, dangling references) that the reader let through
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise TraceError(f"cannot compare {ta.path} and {tb.path}: damaged trace? "
                             f"({type(exc).__name__}: {msg})") from None
    finally:
        for t in own:
            t.close()


def _no_progress(phase, done=None, total=None):
    pass


def _attach_explain(result, d, analysis=None):
    """Add the short replay verdict and the chain to a result (never fails locate)."""
    from . import explain as _explain

    if result.first_difference is None and (analysis is None or analysis.get("event") is None):
        if analysis is not None:
            analysis["analysis"] = _explain.analyse(result, d)
        return
    try:
        full = _explain.analyse(result, d, (analysis or {}).get("event"))
    except TraceError:
        raise
    except Exception as exc:  # an explanation must never break locate
        result.explain = {"verdict": f"no explanation: {type(exc).__name__}: {str(exc)[:160]}"}
        return
    if analysis is not None:
        analysis["analysis"] = full
    result.explain, result.chain = _explain.short(full)
