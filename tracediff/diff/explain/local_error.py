"""What one op adds of its own to a difference: its local error on each side.

An op whose inputs already differ carries what it inherits; the question for the sources
(`explain/sources.py`) is whether it adds more. Each side's op is re-run here on that
side's own recorded inputs (`explain/replay/`), in its dtype and in float64:

* this machine reproduces both sides bitwise, in the same dtypes: both computed the same
  way, the op adds nothing of its own (`Measure.source` False);
* otherwise a side's local error is `recorded - exact(its own inputs)` and the op adds
  `local_a - local_b` (what is left of `out_a - out_b` once the inherited part is taken
  out); it is a source where one side computes differently: reproduced on one side only, or
  one side's local error `LOCAL_RATIO` times the other's (values from another backend,
  which nothing here reproduces).

A compiled jit call is judged the same way against its own equations run one by one
(`measure_compiled`): `compiled - replayed` on each side is what its fusion adds.
Copies, views and single correctly rounded operations are never re-run (`rounds_its_own`).
"""

import numpy as np

from ..compare import args as _args
from ..compare import values as compare
from .replay.calls import build_call, recorded_output_size
from .verdict import event_inputs, event_outputs, recorded_backend, replay_backend

LOCAL_RATIO = 4.0      # one side's local error this many times the other's: it computes differently


FUSED_APART = 0.5      # a compiled call's fusion errors this far apart (of the larger): compiled


def _l2(x):
    return float(np.sqrt(np.sum(np.square(np.asarray(x, np.float64)))))


def _floating(x):
    return x is not None and compare.is_floating(np.asarray(x).dtype.name) and \
        np.asarray(x).dtype.kind != "c"


class Measure:
    """One event judged: source or not, which side, local errors, the relative difference
    it adds where it acts."""

    __slots__ = ("source", "side", "local_a", "local_b", "added_rel", "diff_rel", "replayed",
                 "reason", "reproduced", "sq_diff", "sq_out")

    def __init__(self):
        self.source, self.side = False, ""
        self.sq_diff = self.sq_out = 0.0   # ||out_a - out_b||^2, ||out_a||^2 (introduced)
        self.local_a = self.local_b = None
        self.added_rel = self.diff_rel = 0.0
        self.replayed = 0
        self.reason = ""
        self.reproduced = (None, None)


def _replay_here(d, side, ev):
    """(call, inputs, recorded outputs, reproduced) of one side's event re-run here in its
    dtype from its own recorded inputs; reproduced is None when it was computed on another
    backend (a TPU's values replayed on a CPU say nothing of the TPU). Raises CannotReplay."""
    t = d.ta if side == "a" else d.tb
    e = t.event(ev)
    inputs = event_inputs(d, side, ev)
    call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                      recorded_output_size(t, ev))
    recorded = event_outputs(d, side, ev)
    there, mine = recorded_backend(t, e["framework"]), replay_backend(e["framework"])
    if there and mine and there != mine:
        return call, inputs, recorded, None
    here = call.run(inputs)
    reproduced = len(here) == len(recorded) and all(
        r is not None and np.shape(h) == np.shape(r) and
        np.asarray(h).dtype == np.asarray(r).dtype and
        np.asarray(h).tobytes() == np.asarray(r).tobytes() for h, r in zip(here, recorded))
    return call, inputs, recorded, reproduced


def measure_event(d, ea, eb, inputs_equal, replay):
    """Judge one differing event (see the module docstring)."""
    m = Measure()
    oa, ob = event_outputs(d, "a", ea), event_outputs(d, "b", eb)
    pairs = [(x, y) for x, y in zip(oa, ob) if _floating(x) and _floating(y) and
             np.shape(x) == np.shape(y)]
    if inputs_equal:
        m.source, m.side = True, "both"
        if pairs:
            num = _l2(np.concatenate([(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                                      .ravel() for x, y in pairs]))
            den = _l2(np.concatenate([np.asarray(x, np.float64).ravel() for x, _ in pairs]))
            m.added_rel = m.diff_rel = num / den if den > 0 else float(num > 0)
            m.sq_diff, m.sq_out = num * num, den * den
        else:
            m.added_rel = m.diff_rel = _metric_rel(d, ea, eb)
        return m
    op = d.ta.string(d.ta.events[ea]["op"])
    if not replay or not pairs or not rounds_its_own(op):
        m.reason = "not replayed" if rounds_its_own(op) else \
            "a single correctly rounded operation or a copy: it cannot compute differently"
        return m
    try:
        here_a = _replay_here(d, "a", ea)
        here_b = _replay_here(d, "b", eb)
    except Exception as exc:   # CannotReplay, or an odd value: not judged (never a source)
        m.reason = f"not replayed: {str(exc)[:80]}"
        return m
    m.replayed = 2
    ra, rb = m.reproduced = (here_a[3], here_b[3])
    if ra and rb and _same_dtypes(here_a[2], here_b[2]):
        m.reason = "both sides reproduced here: the op computes the same way on both"
        return m
    try:
        _local(m, here_a, here_b)
    except Exception as exc:   # the float64 run failed: not judged
        m.reason = f"no exact result: {str(exc)[:80]}"
        return m
    if not m.added_rel and m.local_a is None:
        return m
    la, lb = m.local_a or 0.0, m.local_b or 0.0
    lo, hi = min(la, lb), max(la, lb)
    differently = ra is False or rb is False or (m.local_a is not None and
                                                  hi >= LOCAL_RATIO * max(lo, 1e-300))
    if differently and m.added_rel > 0:
        m.source = True
        m.side = ("b" if ra and rb is False else "a" if rb and ra is False else
                  "a" if la > lb else "b")
    return m


def _same_dtypes(outs_a, outs_b):
    """True when the two sides' outputs have the same dtypes: reproduced on both sides then
    means computed the same way; in two dtypes (autocast on one side) the narrower one adds
    its own rounding however faithfully this machine reproduces it."""
    return [np.asarray(x).dtype for x in outs_a if x is not None] == \
        [np.asarray(y).dtype for y in outs_b if y is not None]


def _local(m, here_a, here_b):
    """Fill in the local errors (relative L2 of recorded - exact(own inputs)) of both sides
    and the relative difference the op adds (`local_a - local_b`)."""
    outs = []
    for call, inputs, recorded, _ in (here_a, here_b):
        outs.append((recorded, call.run(inputs, upcast=True)))
    (rec_a, ex_a), (rec_b, ex_b) = outs
    la, lb, added, diff, norm = [], [], [], [], []
    for ra, xa, rb, xb in zip(rec_a, ex_a, rec_b, ex_b):
        if not (_floating(ra) and _floating(rb)) or np.shape(ra) != np.shape(rb) or \
                np.shape(xa) != np.shape(ra) or np.shape(xb) != np.shape(rb):
            continue
        ra64, rb64 = np.asarray(ra, np.float64), np.asarray(rb, np.float64)
        xa64, xb64 = np.asarray(xa, np.float64), np.asarray(xb, np.float64)
        with np.errstate(all="ignore"):
            ea_, eb_ = ra64 - xa64, rb64 - xb64
        ok = np.isfinite(ea_) & np.isfinite(eb_)
        la.append(np.where(ok, ea_, 0).ravel())
        lb.append(np.where(ok, eb_, 0).ravel())
        added.append(np.where(ok, ea_ - eb_, 0).ravel())
        diff.append(np.where(ok, ra64 - rb64, 0).ravel())
        norm.append(np.where(ok, xa64, 0).ravel())
    if not la:
        m.reason = "no floating outputs to measure"
        return
    den = _l2(np.concatenate(norm)) or 1.0
    if np.asarray(rec_a[0]).dtype.itemsize < 8:   # float64 ops: "exact" is this machine's own
        m.local_a = _l2(np.concatenate(la)) / den
        m.local_b = _l2(np.concatenate(lb)) / den
    m.added_rel = _l2(np.concatenate(added)) / den
    m.diff_rel = _l2(np.concatenate(diff)) / den


# JAX primitives that are one correctly rounded IEEE operation (or exact): every machine
# computes them alike from the same inputs, so they only carry what they inherit (denormals
# flushed to zero aside)
_EXACT_JAX = frozenset("""
add add_any sub mul div neg abs max min sqrt select_n sign floor ceil round convert_element_type
square clamp nextafter rem copy copy_p eq ne lt le gt ge and or not xor
""".split())


def rounds_its_own(op) -> bool:
    """False for an op that cannot compute differently on two machines from the same
    inputs: a copy, view or selection, or a single correctly rounded JAX operation."""
    base = _args.base_name(op)
    return base not in _args.DATA_MOVEMENT and op not in _EXACT_JAX


def _metric_rel(d, ea, eb):
    """The worst relative difference of a pair from the comparison (hash-and-statistics
    traces: a bound from the statistics), 1.0 when none is known."""
    try:
        metrics = d.compare_event(ea, eb).get("metrics") or {}
    except Exception:   # an odd row: the source is kept, its weight unknown
        metrics = {}
    rel = metrics.get("max_rel")
    return float(rel) if rel is not None and np.isfinite(rel) else 1.0


def sinks(t, call):
    """The call's direct equations whose outputs no event reads: what leaves the jit."""
    kids = np.flatnonzero(t.events["parent"] == call)
    if not len(kids):
        return kids
    read = np.zeros(len(t), bool)
    prod = t.inputs["producer"]
    read[prod[(prod >= 0) & (prod < len(t))]] = True
    return kids[~read[kids]]


def measure_compiled(d, ea, eb):
    """Judge a compiled call: each of its floating outputs matched to the replayed equation
    output closest to it on a (the replay of that very value), the same equation's output
    on b; fusion_x = compiled_x - replayed_x; a source where one side's is `LOCAL_RATIO`
    times the other's."""
    m = Measure()
    comp_a, comp_b = event_outputs(d, "a", ea), event_outputs(d, "b", eb)
    paired = [int(e) for e in sinks(d.ta, ea) if int(d.al.a2b[int(e)]) >= 0]
    outs = [(e, k, x) for e in paired for k, x in enumerate(event_outputs(d, "a", e))
            if _floating(x)]
    fa, fb, added, norm = [], [], [], []
    for ca, cb in zip(comp_a, comp_b):
        if not (_floating(ca) and _floating(cb)) or np.shape(ca) != np.shape(cb):
            continue
        ca64 = np.asarray(ca, np.float64)
        best = None
        for e, k, x in outs:
            if np.shape(x) != np.shape(ca) or np.asarray(x).dtype != np.asarray(ca).dtype:
                continue
            with np.errstate(all="ignore"):
                gap = float(np.nanmax(np.abs(np.asarray(x, np.float64) - ca64))) if ca64.size \
                    else 0.0
            if best is None or gap < best[0]:
                best = (gap, e, k)
        if best is None or not best[0] <= 1e-3 * (float(np.max(np.abs(ca64))) if ca64.size
                                                  else 0.0) + 1e-30:
            continue   # no replayed equation gives this output
        ra = event_outputs(d, "a", best[1])[best[2]]
        rb_all = event_outputs(d, "b", int(d.al.a2b[best[1]]))
        rb = rb_all[best[2]] if best[2] < len(rb_all) else None
        if not _floating(rb) or np.shape(rb) != np.shape(cb):
            continue
        with np.errstate(all="ignore"):
            xa = ca64 - np.asarray(ra, np.float64)
            xb = np.asarray(cb, np.float64) - np.asarray(rb, np.float64)
        ok = np.isfinite(xa) & np.isfinite(xb)
        fa.append(np.where(ok, xa, 0).ravel())
        fb.append(np.where(ok, xb, 0).ravel())
        added.append(np.where(ok, xa - xb, 0).ravel())
        norm.append(np.where(ok, ca64, 0).ravel())
    if not fa:
        m.reason = "not replayed: no replayed equation gives its outputs"
        return m
    m.replayed = 1
    den = _l2(np.concatenate(norm)) or 1.0
    la, lb = _l2(np.concatenate(fa)) / den, _l2(np.concatenate(fb)) / den
    m.local_a, m.local_b = la, lb
    m.added_rel = _l2(np.concatenate(added)) / den
    # compiled alike on both sides, nearly equal inputs give nearly the same fusion error
    # (added far below either); compiled differently, what they add is as large as either
    hi = max(la, lb)
    if hi > 0 and m.added_rel > 0 and (hi >= LOCAL_RATIO * min(la, lb) or
                                       m.added_rel >= FUSED_APART * hi):
        m.source, m.side = True, "a" if la > lb else "b"
    return m
