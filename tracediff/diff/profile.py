"""Per-event difference magnitude along the whole aligned run (for plots).

`event_profile(differ)` gives, for every aligned pair of events in the order of trace a,
the worst relative difference of its outputs (the `max_rel` of `compare/values.py`:
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
from ..trace.reader import Trace
from .locate import locate, open_differ

CHUNK_BYTES = 32 << 20
MAX_VALUE_BYTES = 4 << 20


def event_profile(d, max_exact=5000):
    """Dict of numpy arrays, one entry per aligned pair (order of trace a): a, b (event
    indices), step, kind, origin, op, name_stack, source (strings of trace a; "LIB ← USER"
    as recorded for an op run inside library code), max_rel (float64; 0 for bitwise equal,
    NaN when not computed), beyond (bool: outside tolerance), bitwise_equal (bool)."""
    ia, ib = d.pairs()
    n = len(ia)
    max_rel = np.zeros(n, np.float64)
    beyond = np.zeros(n, bool)
    bitwise = d.sa.content[ia] == d.sb.content[ib]
    todo = np.flatnonzero(~bitwise)
    done = np.zeros(n, bool)
    done[bitwise] = True
    if len(todo):
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
    """Vectorised max_rel / beyond for differing pairs with one float output each (the
    differ's scan, `Differ.scan_single_outputs`)."""
    ok, rel, out = d.scan_single_outputs(ia[todo], ib[todo], MAX_VALUE_BYTES, CHUNK_BYTES)
    k = todo[ok]
    max_rel[k], beyond[k], done[k] = rel[ok], out[ok], True


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
