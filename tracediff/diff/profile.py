"""Per-event difference magnitude along the whole aligned run (for plots).

`event_profile(differ)` gives, for every aligned pair of events in the order of trace a,
the worst relative difference of its outputs (the `max_rel` of `compare.py`:
|a - b| / max(|a|, |b|), 0 where equal, inf for NaN against a number) and whether it
is beyond tolerance. Pairs whose content hashes are equal are 0 without reading a
value. Pairs with one float or complex output of the same dtype and shape on both sides are
computed in large vectorised batches; every other differing pair goes through the
differ's own exact per-event comparison (`Differ.compare_event`, cached), up to
`max_exact` of them (the rest are NaN: not computed).
"""

import math

import numpy as np

from ..trace import schema
from . import compare
from ..trace.reader import Trace
from .locate import locate, open_differ

CHUNK_BYTES = 32 << 20
MAX_VALUE_BYTES = 4 << 20


def _take(blob, offsets, lengths):
    lengths = lengths.astype(np.int64)
    starts = np.repeat(offsets.astype(np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                       lengths)
    return blob[starts + np.arange(int(lengths.sum()), dtype=np.int64)]


def event_profile(d, max_exact=5000):
    """Dict of numpy arrays, one entry per aligned pair (order of trace a): a, b (event
    indices), step, kind, origin, op, name_stack, source (strings of trace a), max_rel (float64; 0 for bitwise equal,
    NaN when not computed), beyond (bool: outside tolerance), bitwise_equal (bool)."""
    ia, ib = d.pairs()
    n = len(ia)
    max_rel = np.zeros(n, np.float64)
    beyond = np.zeros(n, bool)
    bitwise = d.sa.content[ia] == d.sb.content[ib]
    todo = np.flatnonzero(~bitwise)
    done = np.zeros(n, bool)
    done[bitwise] = True
    if len(todo) and d.ra.blob is not None and d.rb.blob is not None:
        _fast(d, ia, ib, todo, max_rel, beyond, done)
    rest = np.flatnonzero(~done)
    for j, k in enumerate(rest.tolist()):
        if j >= max_exact:
            max_rel[rest[j:]] = np.nan
            break
        r = d.compare_event(int(ia[k]), int(ib[k]))
        m = r["metrics"] or {}
        rel = m.get("max_rel")
        max_rel[k] = 0.0 if r["bitwise_equal"] else math.nan if rel is None else rel
        beyond[k] = not r["within_tolerance"]
        bitwise[k] = r["bitwise_equal"]
    ev = d.ta.events
    strings = np.array(list(d.ta.strings) + [""], dtype=object)

    def resolve(col):
        idx = ev[col][ia].astype(np.int64)
        return strings[np.where((idx >= 0) & (idx < len(d.ta.strings)), idx, len(d.ta.strings))]

    kinds = np.array([schema.KIND_NAMES.get(i, "?") for i in range(256)], dtype=object)
    origins = np.array([schema.ORIGIN_NAMES.get(i, "?") for i in range(256)], dtype=object)
    return {"a": ia.astype(np.int64), "b": ib.astype(np.int64),
            "step": ev["step"][ia].astype(np.int64),
            "kind": kinds[ev["kind"][ia].astype(np.int64)],
            "origin": origins[ev["origin"][ia].astype(np.int64)],
            "op": resolve("op"), "name_stack": resolve("name_stack"), "source": resolve("source"),
            "max_rel": max_rel, "beyond": beyond, "bitwise_equal": bitwise}


def _fast(d, ia, ib, todo, max_rel, beyond, done):
    """Vectorised max_rel / beyond for differing pairs with one float output each."""
    sa, sb = d.sa, d.sb
    simple = (sa.n_out[ia[todo]] == 1) & (sb.n_out[ib[todo]] == 1) & \
        (sa.kind[ia[todo]] != schema.KIND_OPTIM)
    sel = todo[simple]
    if not len(sel):
        return

    def rows(side, ev):
        keys = side.key(ev, schema.ROLE_OUT, 0)
        pos = np.minimum(np.searchsorted(side.vkey, keys), max(len(side.vkey) - 1, 0))
        return side.trace.values[side.vrow[pos]], side.vkey[pos] == keys

    va, fa = rows(sa, ia[sel])
    vb, fb = rows(sb, ib[sel])
    bad = schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED
    good = fa & fb & (va["offset"] >= 0) & (vb["offset"] >= 0) & ((va["flags"] & bad) == 0) & \
        ((vb["flags"] & bad) == 0) & (sa.gid[va["dtype"]] == sb.gid[vb["dtype"]]) & \
        (sa.gid[va["shape"]] == sb.gid[vb["shape"]]) & (va["nbytes"] == vb["nbytes"]) & \
        (va["nbytes"] > 0) & (va["nbytes"] <= MAX_VALUE_BYTES)
    dnames = np.array([d.ta.string(x) for x in va["dtype"]], dtype=object)
    snames = np.array([d.ta.string(x) for x in va["storage"]], dtype=object)
    for dt in ("float64", "float32", "float16", "complex128", "complex64"):
        idx = np.flatnonzero(good & (dnames == dt) & (snames == dt))
        if not len(idx):
            continue
        r, t = compare.tolerance(dt, d.rtol, d.atol)
        item = np.dtype(dt).itemsize
        start = 0
        while start < len(idx):
            nb = va["nbytes"][idx[start:]].astype(np.int64)
            stop = start + max(1, int(np.searchsorted(np.cumsum(nb), CHUNK_BYTES)))
            part = idx[start:stop]
            wide = np.complex128 if dt.startswith("complex") else np.float64
            xa = _take(d.ra.blob, va["offset"][part], va["nbytes"][part]).view(dt).astype(wide)
            xb = _take(d.rb.blob, vb["offset"][part], vb["nbytes"][part]).view(dt).astype(wide)
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                nan_a, nan_b = np.isnan(xa), np.isnan(xb)
                equal = (xa == xb) | (nan_a & nan_b)
                diff = np.abs(xa - xb)
                scale = np.maximum(np.abs(xa), np.abs(xb))
                rel = np.where(equal, 0.0, diff / np.where(scale == 0, 1.0, scale))
                rel = np.where(np.isnan(rel) | (nan_a ^ nan_b), np.inf, rel)
                out = ~equal & ~(np.isfinite(diff) & (diff <= t + r * scale))
            seg = np.concatenate([[0], np.cumsum(va["nbytes"][part].astype(np.int64) // item)[:-1]])
            k = sel[part]
            max_rel[k] = np.maximum.reduceat(rel, seg)
            beyond[k] = np.maximum.reduceat(out.astype(np.int8), seg) == 1
            done[k] = True
            start = stop


def locate_with_profile(a, b, rtol=None, atol=None, map_file=None):
    """(LocateResult, event profile) of two trace paths. The result is exactly what
    `locate()` returns (with whatever it attaches); the profile comes from a differ of
    its own (aligning again costs a fraction of locating)."""
    result = locate(a, b, rtol=rtol, atol=atol, map_file=map_file)
    with Trace(a) as ta:
        if b is None:   # one trace that recorded both frameworks: its two sides
            d, _ = open_differ(ta, ta, rtol, atol, map_file)
            return result, event_profile(d)
        with Trace(b) as tb:
            d, _ = open_differ(ta, tb, rtol, atol, map_file)
            return result, event_profile(d)
