"""Align the events of two traces by sequence alignment over event signatures.

Signature of an event: (framework, kind, normalised op, name stack, output dtypes and
shapes by slot; by name for optimizer snapshots), hashed to one uint64 per event.
Index equality is never assumed: another JAX version adds or reorders equations,
torch picks foreach or per-parameter optimizers, and so on.

Algorithm (near-linear for near-identical traces):

1. Identical signature sequences: identity, one vectorised comparison.
2. Otherwise anchor on top-level events that structure a run: JAX `call` events and
   optimizer-step snapshots. The anchor sequences are aligned with Myers' O(ND) diff,
   then each region between two consecutive matched anchors (a call's replayed eqns,
   the ops of one training step) is aligned on its own with the same diff.
3. Myers' diff first trims the common prefix and suffix (vectorised), and follows each
   diagonal "snake" with numpy chunk comparisons, so its cost is O(N) numpy work plus
   O(D^2) Python steps for D edits. When a region needs more than `MAX_EDITS` edits the
   region falls back to pairing equal signatures position by position after the common
   prefix and suffix (reported as `fallback_regions` in the stats).

Bounded work (a trace is untrusted input): the O(D^2) Python steps are the only
super-linear part, so one alignment gets a `Budget` of them: each region may spend
`FREE_STEPS_PER_EVENT` steps per event it holds, plus what is left of a shared pool of
`POOL_STEPS` (about two regions at the full `MAX_EDITS`). A region that would need more
falls back as above. A region whose signatures differ by more than `MAX_EDITS` in their
counts alone cannot be aligned within the cap: it falls back without running the diff.
Regions repeat (every training step is the same sequence of ops), so the result of each
diff is remembered by the contents of the two regions and a repeated region costs nothing.
Real traces (a few to a few hundred edits per distinct region) stay far inside the budget,
so their alignment is exactly Myers'; a hostile pair of many maximally different regions
costs at most the pool plus a linear term (seconds), not minutes.

4. Gaps (a run of unmatched events on both sides between the same two matched events) are
   aligned once more (`refine_gaps`): ops that only convert dtype or layout (`_to_copy`,
   `to`, `contiguous`, a JAX `convert_element_type`: `TRANSPARENT_OPS`) are set aside, and
   the rest are paired by a signature without output dtypes (`Side.lsig`). Mixed precision
   inserts casts and changes every dtype after them; without this the region both sides
   computed would be hidden in a gap (the ops are compared, and their dtypes reported).
"""

import dataclasses

import numpy as np

from ...trace import schema
from ...trace.sources import LIB_SEP, split_site
from ...trace.values import rows_with_data

MAX_EDITS = 2000
POOL_STEPS = 4_000_000        # Myers steps shared by all regions of one alignment (~2 full regions)
FREE_STEPS_PER_EVENT = 16     # Myers steps each region may spend per event it holds

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def mix(*cols):
    """Vectorised 64-bit hash of integer columns (splitmix64 finaliser over a combination)."""
    h = np.zeros(np.broadcast(*cols).shape if len(cols) > 1 else np.shape(cols[0]), np.uint64)
    for c in cols:
        c = np.asarray(c).astype(np.int64).view(np.uint64) if np.asarray(c).dtype != np.uint64 \
            else np.asarray(c)
        h = (h ^ c) * _M1
        h ^= h >> np.uint64(31)
        h = h * _M2
        h ^= h >> np.uint64(29)
    return h * _M3


def normalise_op(op):
    """Primitive names that changed between versions: `pjit` is `jit` since jax 0.7
    (also when a recorder suffixes the function name: `pjit:f` is `jit:f`). A source
    "LIB ← USER" is its user site: the library's line numbers change between library
    versions, and a compiled graph names the user's line only (diff/pairing/compiled.py)."""
    if LIB_SEP in op:
        return split_site(op)[0]
    if op == "pjit":
        return "jit"
    if op.startswith("pjit:"):
        return op[1:]
    return op



def unmatched_runs(a2b, limit):
    """The first LIMIT runs of consecutive unmatched positions (a2b < 0): [(start, length)]."""
    um = np.flatnonzero(np.asarray(a2b) < 0)
    if not len(um):
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(um) > 1) + 1])
    ends = np.concatenate([starts[1:], [len(um)]])
    return [(int(um[s]), int(e - s)) for s, e in list(zip(starts, ends))[:limit]]

class StringIds:
    """One id space for the strings of several traces (so ids compare across traces)."""

    def __init__(self):
        self.ids = {}

    def map(self, strings, normalise=None):
        ids = self.ids
        norm = normalise or (lambda s: s)
        out = np.fromiter((ids.setdefault(norm(s), len(ids)) for s in strings), np.int64,
                          count=len(strings))
        return np.concatenate([out, np.array([-1], np.int64)])  # index -1 -> -1


@dataclasses.dataclass
class Side:
    """A trace prepared for diffing: signatures, content hashes, value lookup."""

    trace: object
    gid: np.ndarray          # per-trace string index -> global id (last entry: -1)
    sig: np.ndarray          # uint64 signature per event
    content: np.ndarray      # uint64 combined hash of the comparable output values
    n_out: np.ndarray        # number of output values per event
    kind: np.ndarray
    call: np.ndarray
    parent: np.ndarray
    vkey: np.ndarray         # sorted lookup keys of the values table
    vrow: np.ndarray         # values-table row for each key
    ns: np.ndarray = None    # global id of each event's name stack (module path)
    lsig: np.ndarray = None  # signature without output dtypes (refine_gaps)
    transparent: np.ndarray = None   # bool: the op only converts dtype or layout

    # key layout: event << 21 | role << 20 | slot
    @staticmethod
    def key(event, role, slot):
        return (np.asarray(event, np.int64) << 21) | (np.asarray(role, np.int64) << 20) | \
            (np.asarray(slot, np.int64) & 0xFFFFF)

    def value_row(self, event, slot, role=schema.ROLE_OUT):
        """values-table row of (event, slot, role), or None."""
        k = int(self.key(event, role, slot))
        i = int(np.searchsorted(self.vkey, k))
        if i < len(self.vkey) and self.vkey[i] == k:
            return self.trace.values[self.vrow[i]]
        return None


def prepare(trace, strings):
    """Build a `Side` for `trace` with string ids from the shared `strings` space."""
    ev, vals = trace.events, trace.values
    n = len(ev)
    gid = strings.map(trace.strings, normalise_op)
    n_str = len(trace.strings)

    def sidx(col):  # damaged string references read as "no string", like Trace.string
        col = np.asarray(col, np.int64)
        return np.where((col >= 0) & (col < n_str), col, -1)

    op = gid[sidx(ev["op"])]
    ns = gid[sidx(ev["name_stack"])]
    kind = ev["kind"].astype(np.int64)
    # output signature and content per event
    out = vals[vals["role"] == schema.ROLE_OUT]
    ev_of = out["event"].astype(np.int64)
    is_optim = kind[ev_of] == schema.KIND_OPTIM if n else np.zeros(0, bool)
    slot_key = np.where(is_optim, gid[sidx(out["name"])] + (1 << 40), out["slot"].astype(np.int64))
    shape_sig = mix(slot_key, gid[sidx(out["dtype"])], gid[sidx(out["shape"])])
    outsig = np.zeros(n, np.uint64)
    np.add.at(outsig, ev_of, shape_sig)
    loose = np.zeros(n, np.uint64)
    np.add.at(loose, ev_of, mix(slot_key, gid[sidx(out["shape"])]))
    # stats-only values (--level stats/calls) carry the hash of their exact bytes too
    _, comparable = rows_with_data(out)
    content = np.zeros(n, np.uint64)
    np.add.at(content, ev_of[comparable], mix(slot_key[comparable], out["hash"][comparable]))
    _shard_content(trace, out, comparable, gid, sidx, content)
    n_out = np.bincount(ev_of, minlength=n) if n else np.zeros(0, np.int64)
    sig = mix(ev["framework"], kind, op, ns, outsig) if n else np.zeros(0, np.uint64)
    lsig = mix(ev["framework"], kind, op, ns, loose) if n else np.zeros(0, np.uint64)
    ids = [strings.ids[name] for name in TRANSPARENT_OPS if name in strings.ids]
    transparent = np.isin(op, ids) if ids else np.zeros(n, bool)
    keys = Side.key(vals["event"], vals["role"], vals["slot"])
    order = np.argsort(keys, kind="stable")
    return Side(trace=trace, gid=gid, sig=sig, content=content, n_out=n_out, kind=kind,
                call=ev["call"].astype(np.int64), parent=ev["parent"].astype(np.int64),
                vkey=keys[order], vrow=order, ns=ns, lsig=lsig, transparent=transparent)


# ops that only convert dtype or layout: transparent to alignment (refine_gaps), never a
# structural difference of their own (an inserted cast is what autocast does)
TRANSPARENT_OPS = ("aten::_to_copy", "aten::to.dtype", "aten::to.dtype_layout",
                   "aten::to.device", "aten::to.other", "aten::contiguous",
                   "aten::_autocast_to_reduced_precision", "aten::_autocast_to_full_precision",
                   "aten::view.dtype", "aten::type_as", "convert_element_type")


def _shard_content(trace, out, comparable, gid, sidx, content):
    """A value with no global bytes whose per-device shards were stored (a global array
    over several processes: each records its own shards) counts by those shards'
    digests, keyed by device, index and replica."""
    sh = getattr(trace, "shard_rows", None)
    if sh is None or not len(sh):
        return
    missing = ~comparable & ((out["flags"] & (schema.VFLAG_UNINIT | schema.VFLAG_STATS)) == 0)
    if not missing.any():
        return
    keys = Side.key(out["event"][missing], schema.ROLE_OUT, out["slot"][missing])
    sh = sh[sh["role"] == schema.ROLE_OUT]
    sel = np.isin(Side.key(sh["event"], schema.ROLE_OUT, sh["slot"]), keys)
    sh = sh[sel]
    if len(sh):
        np.add.at(content, sh["event"].astype(np.int64),
                  mix(sh["slot"].astype(np.int64), gid[sidx(sh["device"])],
                      gid[sidx(sh["index"])], sh["replica"].astype(np.int64), sh["hash"]))


# -- Myers diff --------------------------------------------------------------------------

class Budget:
    """Myers steps (one per diagonal per edit round) that one alignment may still spend
    beyond each region's own linear allowance (see the module docstring)."""

    def __init__(self, pool=POOL_STEPS):
        self.pool = pool
        self.exhausted = 0     # regions refused for lack of budget
        self.memo = {}         # (region a, region b, max_edits) -> myers() result

    def allowance(self, n, m):
        return FREE_STEPS_PER_EVENT * (n + m)


def _snake(a, b, x, y):
    """Advance (x, y) along equal elements; returns the new x."""
    n, m = len(a), len(b)
    step = 32
    while x < n and y < m:
        k = min(step, n - x, m - y)
        eq = a[x:x + k] == b[y:y + k]
        if eq.all():
            x += k
            y += k
            step = min(step * 2, 1 << 16)
            continue
        return x + int(np.argmin(eq))
    return x


def myers(a, b, max_edits=MAX_EDITS, budget=None):
    """Matched runs [(ia, ib, length)] of two equality-comparable numpy arrays, or None
    when more than `max_edits` insertions/deletions are needed (or when the `Budget`
    runs out first)."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    budget = budget if budget is not None else Budget()
    free = budget.allowance(n, m)
    al, bl = a.tolist(), b.tolist()
    off = max_edits + 1
    v = [0] * (2 * off + 1)
    history = []
    for d in range(0, max_edits + 1):
        cost = d + 1
        if free >= cost:
            free -= cost
        elif budget.pool >= cost - free:
            budget.pool -= cost - free
            free = 0
        else:
            budget.exhausted += 1
            return None
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            if x < n and y < m and al[x] == bl[y]:   # a snake: follow it (numpy chunks)
                x = _snake(a, b, x + 1, y + 1)
            v[off + k] = x
            if x >= n and x - k >= m:
                history.append(v[off - d: off + d + 1])
                return _backtrack(history, n, m)
        history.append(v[off - d: off + d + 1])
    return None


def _edits_at_least(a, b):
    """A lower bound of the edits between a and b: the difference of their value counts
    (each surplus occurrence of a value must be inserted or deleted)."""
    vals, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    ca = np.bincount(inv[:len(a)], minlength=len(vals))
    cb = np.bincount(inv[len(a):], minlength=len(vals))
    return int(np.abs(ca - cb).sum())


def _backtrack(history, n, m):
    runs = []
    x, y = n, m
    for d in range(len(history) - 1, 0, -1):
        prev = history[d - 1]          # index k + (d - 1)
        k = x - y
        if k == -d or (k != d and prev[k - 1 + d - 1] < prev[k + 1 + d - 1]):
            pk = k + 1
            px = prev[pk + d - 1]
            mx = px
        else:
            pk = k - 1
            px = prev[pk + d - 1]
            mx = px + 1
        my = mx - k
        if x > mx:
            runs.append((mx, my, x - mx))
        x, y = px, px - pk
    if x > 0:
        runs.append((0, 0, x))
    runs.reverse()
    return runs


def align_arrays(a, b, max_edits=MAX_EDITS, budget=None):
    """(pairs_a, pairs_b, fallback) for two signature arrays; `budget`: a `Budget` shared
    by the regions of one alignment (a fresh one when None)."""
    n, m = len(a), len(b)
    if n == m and np.array_equal(a, b):
        r = np.arange(n, dtype=np.int64)
        return r, r.copy(), False
    # common prefix / suffix, vectorised
    k = min(n, m)
    neq = np.flatnonzero(a[:k] != b[:k])
    pre = int(neq[0]) if len(neq) else k
    neq = np.flatnonzero(a[n - k + pre:][::-1] != b[m - k + pre:][::-1]) if k > pre else []
    suf = int(neq[0]) if len(neq) else k - pre
    ma, mb = a[pre:n - suf], b[pre:m - suf]
    if len(ma) and len(mb) and len(ma) + len(mb) > max_edits and \
            _edits_at_least(ma, mb) > max_edits:
        runs = None   # Myers would give up after max_edits rounds: skip them
    else:
        budget = budget if budget is not None else Budget()
        key = (ma.tobytes(), mb.tobytes(), max_edits)
        runs = budget.memo.get(key, False)
        if runs is False:
            runs = budget.memo[key] = myers(ma, mb, max_edits, budget)
    fallback = runs is None
    if fallback:
        kk = min(len(ma), len(mb))
        idx = np.flatnonzero(ma[:kk] == mb[:kk])
        mid_a, mid_b = idx + pre, idx + pre
    else:
        if runs:
            mid_a = np.concatenate([np.arange(i, i + L) for i, _, L in runs]) + pre
            mid_b = np.concatenate([np.arange(j, j + L) for _, j, L in runs]) + pre
        else:
            mid_a = mid_b = np.zeros(0, np.int64)
    pa = np.concatenate([np.arange(pre), mid_a, np.arange(n - suf, n)]).astype(np.int64)
    pb = np.concatenate([np.arange(pre), mid_b, np.arange(m - suf, m)]).astype(np.int64)
    return pa, pb, fallback


@dataclasses.dataclass
class Alignment:
    a2b: np.ndarray        # per event of a: matched event of b, or -1
    b2a: np.ndarray
    fallback_regions: int
    anchors_matched: int

    def stats(self):
        na, nb = len(self.a2b), len(self.b2a)
        matched = int((self.a2b >= 0).sum())
        return {"events_a": na, "events_b": nb, "matched": matched,
                "only_in_a": na - matched, "only_in_b": nb - matched,
                "anchors_matched": self.anchors_matched,
                "fallback_regions": self.fallback_regions}

    def gaps(self, limit=5):
        """The first runs of unmatched events on each side: [(side, start, length)]."""
        return [{"side": side, "start": start, "length": length}
                for side, arr in (("a", self.a2b), ("b", self.b2a))
                for start, length in unmatched_runs(arr, limit)]


ANCHOR_KINDS = (schema.KIND_CALL, schema.KIND_OPTIM)


def align(sa, sb, max_edits=MAX_EDITS, budget=None):
    """Align two prepared sides; returns an `Alignment`. The diff work of all its regions
    comes out of one `Budget`."""
    na, nb = len(sa.sig), len(sb.sig)
    a2b = np.full(na, -1, np.int64)
    b2a = np.full(nb, -1, np.int64)
    if na == nb and np.array_equal(sa.sig, sb.sig):
        a2b[:] = np.arange(na)
        b2a[:] = np.arange(nb)
        return Alignment(a2b, b2a, 0, int(np.isin(sa.kind, ANCHOR_KINDS).sum()))
    anc_a = np.flatnonzero(np.isin(sa.kind, ANCHOR_KINDS))
    anc_b = np.flatnonzero(np.isin(sb.kind, ANCHOR_KINDS))
    fallbacks = 0
    budget = budget if budget is not None else Budget()
    if len(anc_a) and len(anc_b):
        pa, pb, fb = align_arrays(sa.sig[anc_a], sb.sig[anc_b], max_edits, budget)
        fallbacks += fb
        ma, mb = anc_a[pa], anc_b[pb]
    else:
        ma = mb = np.zeros(0, np.int64)
    # regions: (-1 .. first anchor), (anchor_i .. anchor_i+1), ..., (last anchor .. end)
    bounds_a = np.concatenate([[-1], ma, [na]])
    bounds_b = np.concatenate([[-1], mb, [nb]])
    for i in range(len(bounds_a) - 1):
        lo_a, hi_a = int(bounds_a[i]) + 1, int(bounds_a[i + 1])
        lo_b, hi_b = int(bounds_b[i]) + 1, int(bounds_b[i + 1])
        if i > 0:
            a2b[lo_a - 1] = lo_b - 1
            b2a[lo_b - 1] = lo_a - 1
        if hi_a <= lo_a or hi_b <= lo_b:
            continue
        pa, pb, fb = align_arrays(sa.sig[lo_a:hi_a], sb.sig[lo_b:hi_b], max_edits, budget)
        if fb and sa.ns is not None and sb.ns is not None:
            # too different to diff as one: module boundaries as anchors, diff inside
            blk = align_blocks(sa.sig[lo_a:hi_a], sb.sig[lo_b:hi_b], sa.ns[lo_a:hi_a],
                               sb.ns[lo_b:hi_b], max_edits, budget)
            if blk is not None and len(blk[0]) > len(pa):
                pa, pb, fb = blk
        fallbacks += fb
        a2b[pa + lo_a] = pb + lo_b
        b2a[pb + lo_b] = pa + lo_a
    if getattr(sa, "lsig", None) is not None and getattr(sb, "lsig", None) is not None:
        refine_gaps(sa, sb, a2b, b2a, max_edits, budget)
    return Alignment(a2b, b2a, fallbacks, len(ma))


def gap_regions(a2b, b2a):
    """[(lo_a, hi_a, lo_b, hi_b)]: the runs of unmatched events that lie between the same
    two matched pairs on both sides (each side non-empty)."""
    ma = np.flatnonzero(a2b >= 0)
    mb = a2b[ma]
    if len(ma) and np.any(np.diff(mb) <= 0):
        return []   # crossed pairs (not from a sequence alignment): nothing to refine
    bounds_a = np.concatenate([[-1], ma, [len(a2b)]])
    bounds_b = np.concatenate([[-1], mb, [len(b2a)]])
    ga = bounds_a[1:] - bounds_a[:-1] > 1
    gb = bounds_b[1:] - bounds_b[:-1] > 1
    return [(int(bounds_a[i]) + 1, int(bounds_a[i + 1]), int(bounds_b[i]) + 1, int(bounds_b[i + 1]))
            for i in np.flatnonzero(ga & gb).tolist()]


def refine_gaps(sa, sb, a2b, b2a, max_edits=MAX_EDITS, budget=None):
    """Pair the events of each gap (`gap_regions`) that differ only in output dtypes, the
    dtype and layout conversions set aside (module docstring, 4); in place."""
    budget = budget if budget is not None else Budget()
    for lo_a, hi_a, lo_b, hi_b in gap_regions(a2b, b2a):
        ia = np.arange(lo_a, hi_a)[~sa.transparent[lo_a:hi_a]]
        ib = np.arange(lo_b, hi_b)[~sb.transparent[lo_b:hi_b]]
        if not len(ia) or not len(ib):
            continue
        pa, pb, _ = align_arrays(sa.lsig[ia], sb.lsig[ib], max_edits, budget)
        if len(pa):
            a2b[ia[pa]] = ib[pb]
            b2a[ib[pb]] = ia[pa]


def _runs(ns):
    """Start of each run of equal module paths, and the run's module path."""
    starts = np.flatnonzero(np.concatenate([[True], ns[1:] != ns[:-1]])) if len(ns) else \
        np.zeros(0, np.int64)
    return starts, ns[starts]


def align_blocks(sig_a, sig_b, ns_a, ns_b, max_edits=MAX_EDITS, budget=None):
    """(pairs_a, pairs_b, fallback) of a region too different for one diff: its runs of
    one module path (a layer's ops) are aligned by module path first, then each matched
    pair of runs on its own (most are equal or nearly: repeated ones come from the memo).
    None when the region has no module structure to anchor on. Work stays bounded: the
    diffs draw on the alignment's `Budget`, and each one is capped as in `align_arrays`."""
    budget = budget if budget is not None else Budget()
    st_a, key_a = _runs(np.asarray(ns_a, np.int64))
    st_b, key_b = _runs(np.asarray(ns_b, np.int64))
    if len(st_a) < 2 or len(st_b) < 2:
        return None
    ba, bb, fb = align_arrays(key_a.astype(np.uint64), key_b.astype(np.uint64), max_edits, budget)
    end_a = np.concatenate([st_a[1:], [len(sig_a)]])
    end_b = np.concatenate([st_b[1:], [len(sig_b)]])
    out_a, out_b, falls = [], [], int(fb)
    # the matched runs, and between two consecutive ones the unmatched runs of each side
    # (a module renamed or split) as one more region
    regions, prev_a, prev_b = [], 0, 0
    for i, j in zip(ba.tolist(), bb.tolist()):
        lo_a, lo_b = int(st_a[i]), int(st_b[j])
        if lo_a > prev_a and lo_b > prev_b:
            regions.append((prev_a, lo_a, prev_b, lo_b))
        prev_a, prev_b = int(end_a[i]), int(end_b[j])
        regions.append((lo_a, prev_a, lo_b, prev_b))
    if len(sig_a) > prev_a and len(sig_b) > prev_b:
        regions.append((prev_a, len(sig_a), prev_b, len(sig_b)))
    for lo_a, hi_a, lo_b, hi_b in regions:
        pa, pb, f = align_arrays(sig_a[lo_a:hi_a], sig_b[lo_b:hi_b], max_edits, budget)
        falls += f
        out_a.append(pa + lo_a)
        out_b.append(pb + lo_b)
    if not out_a:
        return None
    return (np.concatenate(out_a).astype(np.int64), np.concatenate(out_b).astype(np.int64),
            falls > 0)
