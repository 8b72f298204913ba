"""The origin of a trace's non-finite values as a `NonFinite`: the first root whose NaN or
Inf the run kept (graph.py), what it read, how it made them (mechanism.py), and where Inf
turned into NaN on the way."""

import os

import numpy as np

from ... import shell
from ...trace import schema
from ...trace.collectives import is_collective
from ...trace.reader import Trace
from ..result import EventRef, NonFinite, NonFiniteRanks, NonFiniteStep, NonFiniteValue
from .counts import Counts
from .graph import NonFiniteGraph
from .mechanism import describe

MAX_ELEMENT_BYTES = 64 << 20   # a value read whole to name the element where it happened
PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


def find_nonfinite(t):
    """The `NonFinite` of open trace `t`, or None when every recorded value is finite."""
    g = NonFiniteGraph(t, Counts(t))
    if not g.bad.any():
        return None
    roots = g.roots.tolist()
    absorbed, chosen = [], None
    for r in roots:
        w = g.reach(r)
        if w.kept is not None or not w.exhausted:
            chosen = w
            break
        absorbed.append(r)
    note, kept = "", True
    if chosen is None:   # every non-finite value was absorbed before the run kept it
        first = roots[0] if roots else int(np.flatnonzero(g.bad & ~g.holder)[0])
        chosen = g.reach(first)
        absorbed = absorbed[1:]
        kept = False
    elif chosen.kept is None:
        note = (f"the walk from this op stopped after {chosen.visits} events before reaching "
                f"an optimizer step or a kept value")
    res = _result(t, g, chosen, absorbed, note)
    res.kept = kept
    return res


def _ref(t, g, e):
    d = t.event(e)
    d["phase"] = g.phase(e)
    rows = t.value_rows(e, schema.ROLE_OUT)
    rows = rows[np.argsort(rows["slot"], kind="stable")]
    return EventRef.from_event(d, shapes=[t.value_meta(r)["shape"] for r in rows],
                               dtypes=[t.string(r["dtype"]) for r in rows], rank=t.rank)


def _made(g, e):
    nan, inf = int(g.nan_ev[e]), int(g.inf_ev[e])
    return "NaN and Inf" if nan and inf else ("NaN" if nan else "Inf")


def _result(t, g, w, absorbed, note):
    e = w.root
    ev = t.events[e]
    out_row = _first_bad_output(t, g, e)
    inputs, arrays = _inputs(t, g, e)
    out_dtype = t.string(t.values["dtype"][out_row]) if out_row is not None else ""
    made = _made(g, e)
    received = is_collective(t.string(ev["op"])) and all(v.finite for v in inputs) and \
        bool(inputs)
    mechanism, element = describe(t.string(ev["op"]), t.string(ev["params"]), made, out_dtype,
                                  inputs, arrays, _array(t, out_row))
    if received:
        mechanism = (f"received: the values this rank or device sent were finite, those it "
                     f"got back hold {made}: another rank or device made them")
    elif any(v.finite is False and v.source in ("literal", "constant") for v in inputs):
        v = next(v for v in inputs if v.finite is False and v.source in ("literal", "constant"))
        mechanism = (f"it reads a non-finite {v.source} of the program "
                     f"({_g_value(v)}: a mask's fill value?)")
    elif int(ev["kind"]) == schema.KIND_INPUT:
        mechanism = "the value entered the run already non-finite (data, a loaded checkpoint)"
    elif g.phase(e) == "optimizer" and ("division" in mechanism or "0 / 0" in mechanism):
        mechanism += _eps_hint(t, int(ev["step"]))
    zoom = ""
    if int(ev["kind"]) in (schema.KIND_CALL, schema.KIND_OPTIM) and not received:
        what = ("inside the compiled call" if int(ev["kind"]) == schema.KIND_CALL else
                "in the optimizer step's parameters or state")
        mechanism = (f"{what}: the ops that made it were not recorded (--level calls, "
                     f"--steps, --ops or --modules)")
        zoom = _zoom(t, int(ev["step"]))
    res = NonFinite(path=t.path, origin=_ref(t, g, e), made=made, nan=int(g.nan_ev[e]),
                    inf=int(g.inf_ev[e]), elements=_elements(t, e),
                    inputs_finite=_inputs_finite(g, e, inputs), received=received,
                    mechanism=mechanism, element=element, inputs=inputs,
                    absorbed=len(absorbed), level=_level(t, out_row),
                    events_nonfinite=int(g.bad.sum()), note=note, zoom=zoom)
    if absorbed:
        res.first_absorbed = _ref(t, g, absorbed[0])
    if w.kept is not None:
        res.kept_at = _ref(t, g, w.kept)
    if w.nan_at is not None:
        n = w.nan_at
        nin, narr = _inputs(t, g, n)
        nrow = _first_bad_output(t, g, n)
        res.nan_at = _ref(t, g, n)
        res.nan_mechanism, nel = describe(
            t.string(t.events[n]["op"]), t.string(t.events[n]["params"]), _made(g, n),
            t.string(t.values["dtype"][nrow]) if nrow is not None else "", nin, narr,
            _array(t, nrow))
        if nel:
            res.nan_mechanism += f" ({nel})"
        res.chain = [NonFiniteStep(event=_ref(t, g, x), made=_made(g, x)) for x in w.path(n)]
    return res


def _inputs_finite(g, e, inputs):
    if g.bad_own_in[e] or any(v.finite is False for v in inputs):
        return False
    if int(g.kind[e]) == schema.KIND_INPUT:
        return False
    if g.unknown_in[e] or any(v.finite is None for v in inputs):
        return None
    return True


def _elements(t, e):
    n = 0
    for r in t.value_rows(e, schema.ROLE_OUT):
        k = 1
        for d in t.value_meta(r)["shape"]:
            k *= d
        n += k
    return n


def _level(t, idx):
    """How the origin's values are known: "values" (bytes), "statistics", "calls"."""
    if (t.manifest.get("recording") or {}).get("level") == "calls":
        return "calls"
    if idx is None:
        return "values"
    return "statistics" if t.values["flags"][idx] & schema.VFLAG_STATS else "values"


def _first_bad_output(t, g, e):
    """The row number of event `e`'s first non-finite output (by slot), or None."""
    ids = t.value_row_ids(e, schema.ROLE_OUT)
    ids = ids[np.argsort(t.values["slot"][ids], kind="stable")]
    bad = ids[g.bad_row[ids]]
    return int(bad[0]) if len(bad) else (int(ids[0]) if len(ids) else None)


def _array(t, idx):
    """The array of values row `idx` where its bytes are stored and not too large."""
    if idx is None or t.values["nbytes"][idx] > MAX_ELEMENT_BYTES:
        return None
    return t.read_value(t.values[idx])


def _inputs(t, g, e):
    """([NonFiniteValue], [array or None]) of event `e`'s inputs by slot: its own stored
    input values (a literal, a call's arguments, a collective's sent copy), else the
    producer's output that the dataflow names."""
    v_all = t.values
    own = {int(v_all["slot"][i]): int(i) for i in t.value_row_ids(e, schema.ROLE_IN)}
    links = {int(r["slot"]): r for r in t.input_rows(e)}
    out_v, out_a = [], []
    for slot in sorted(set(own) | set(links)):
        link = links.get(slot)
        prod = int(link["producer"]) if link is not None else schema.PRODUCER_UNKNOWN
        idx = own.get(slot)
        if idx is None and 0 <= prod < len(t):
            ids = t.value_row_ids(prod, schema.ROLE_OUT)
            ids = ids[v_all["slot"][ids] == int(link["producer_slot"])]
            idx = int(ids[0]) if len(ids) else None
        src = {schema.PRODUCER_LITERAL: "literal", schema.PRODUCER_CONST: "constant",
               schema.PRODUCER_UNKNOWN: "outside the recording"}.get(prod) or \
            t.string(t.events[prod]["op"])
        v = NonFiniteValue(slot=slot, role="input", source=src, event=prod if prod >= 0 else -1)
        arr = None
        if idx is not None:
            row = v_all[idx]
            meta = t.value_meta(row)
            v.dtype, v.shape = meta["dtype"], meta["shape"]
            if g.counts.nan[idx] >= 0:
                v.nan, v.inf = int(g.counts.nan[idx]), int(g.counts.inf[idx])
            st = t.value_stats(row)
            if st is not None:
                v.min = None if np.isnan(st["min"]) else st["min"]
                v.max = None if np.isnan(st["max"]) else st["max"]
            arr = _array(t, idx)
            if arr is not None and np.asarray(arr).dtype.kind in "fciub":
                v.zeros = int(np.count_nonzero(np.asarray(arr) == 0))
        out_v.append(v)
        out_a.append(arr)
    return out_v, out_a


def _zoom(t, step):
    """The command that records this step of the run again with every op's values."""
    argv = shell.script_argv(t.manifest)
    if argv is None:
        return ""
    root, ext = os.path.splitext(t.path)
    return shell.record_command(argv, f"{root}.step{step}{ext or '.h5'}", None,
                                ["--level", "full", "--steps", f"{step}:{step + 1}"])[-1]


def _g_value(v):
    """-inf, inf or nan: what a non-finite literal holds, from its statistics."""
    if v.nan:
        return "nan"
    return "-inf" if v.min is not None and v.min < 0 and v.min == float("-inf") else "inf"


def _eps_hint(t, step):
    """"; the optimizer's eps is 0" where the settings recorded at this step say so: the
    division by a zero second moment that eps exists to prevent."""
    kinds, steps = t.events["kind"], t.events["step"]
    snaps = np.flatnonzero((kinds == schema.KIND_OPTIM) & (steps == step))
    for e in snaps[:1].tolist():
        for _group, key, value, text in t.optim_settings(e):
            if key.rsplit("/", 1)[-1] == "eps" and value == 0:
                return (f"; the optimizer's {key} is {text}: a parameter whose gradient is "
                        f"zero has a zero second moment, and eps no longer keeps its update "
                        f"from dividing by it")
    return ""


# -- many ranks --------------------------------------------------------------------------------

def find_nonfinite_ranks(paths):
    """`NonFiniteRanks` of one run's per-rank traces ({rank: path}). The first rank is the one whose origin is its own op, not a collective
    that received it; among several, the earliest step and phase."""
    res = NonFiniteRanks(paths=dict(paths))
    for rank, path in sorted(paths.items()):
        with Trace(path) as t:
            res.ranks[rank] = find_nonfinite(t)
    own = [(r, nf) for r, nf in res.ranks.items() if nf is not None and not nf.received]
    if own:
        own.sort(key=lambda x: (x[1].origin.step, PHASE_ORDER.get(x[1].origin.phase, 3), x[0]))
        res.first_rank = own[0][0]
        same = [r for r, nf in own[1:] if (nf.origin.step, nf.origin.phase) ==
                (own[0][1].origin.step, own[0][1].origin.phase)]
        if same:
            res.note = (f"ranks {', '.join(map(str, [own[0][0]] + same))} each made non-finite "
                        f"values of their own in the same step and phase")
    elif any(nf is not None for nf in res.ranks.values()):
        res.note = "every rank received its non-finite values through a collective"
    return res

