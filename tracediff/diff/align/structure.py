"""Structural differences: an op that one run executed and the other did not, and that
changed what the rest of the run computed.

An unpaired event (no counterpart in the alignment) is a structural difference when it
feeds the dataflow: through it (and through any other unpaired events after it) it
reaches a paired event whose inputs then differ bitwise between the runs. An inserted op
whose result equals what the other run read (`x * 1`, a refactor) is not one, and ops
that only convert dtype or layout (`align.TRANSPARENT_OPS`) never are: an inserted cast
is what autocast does, reported on the op that computes in the new dtype
(`Finding.dtype_note`). Only ops that ran as the script ran them are considered (torch
ops, JAX eager primitives); replayed equations differ between JAX versions and are judged
through their calls.
"""

import numpy as np

from ...trace import schema
from ..compare.values import BITWISE
from ..result import EventRef, Structural

KINDS = (schema.KIND_OP, schema.KIND_EAGER)
MAX_CANDIDATES = 2000   # unpaired events examined per side (a trace is untrusted)
MAX_REACH = 64          # events followed through unpaired consumers per candidate
MAX_CONSUMERS = 5


# ops that only reinterpret the bytes they are given (a view, an alias, a transpose): never
# the op that changed values; an in-place write through one is
VIEW_OPS = frozenset(("view", "_unsafe_view", "_reshape_alias", "reshape", "alias", "t",
                      "transpose", "permute", "as_strided", "expand", "slice", "select",
                      "unsqueeze", "squeeze", "flatten", "unflatten", "detach", "narrow",
                      "split", "chunk", "unbind", "view_as", "_local_tensor", "to_local"))


def is_view(op: str) -> bool:
    """aten::view, aten::transpose.int, ...: an op that reinterprets bytes (`VIEW_OPS`)."""
    base = op.split("::")[-1].split(".")[0]
    return base in VIEW_OPS


def is_inplace_write(op: str) -> bool:
    """aten::mul_.Tensor, aten::copy_, aten::index_put_, ...: an op that writes the values of
    a tensor it is given (torch's trailing underscore), through a view or not."""
    base = op.split("::")[-1].split(".")[0]
    return base.endswith("_") and not base.startswith("__") and base not in VIEW_OPS


def _consumers(trace):
    """producer event -> [consumer events], from the inputs table, and from an in-place
    write to the `<input>` snapshot of what it wrote through another view (the snapshot's
    `parent`, capture/torch/dataflow.py)."""
    ins = trace.inputs
    prod = ins["producer"].astype(np.int64)
    ok = prod >= 0
    ev = trace.events
    snap = np.flatnonzero((ev["kind"] == schema.KIND_INPUT) & (ev["parent"] >= 0))
    prod = np.concatenate([prod[ok], ev["parent"][snap].astype(np.int64)])
    cons = np.concatenate([ins["event"][ok].astype(np.int64), snap.astype(np.int64)])
    order = np.argsort(prod, kind="stable")
    return prod[order], cons[order]


def _users(p, c, e):
    lo, hi = np.searchsorted(p, e), np.searchsorted(p, e, side="right")
    return list(dict.fromkeys(c[lo:hi].tolist()))


def first_inserted(d, before=None):
    """The earliest structural difference (`Structural`) of a `Differ` that lies before
    event `before` of trace a (None: anywhere), or None. Earliest in the order of trace a:
    an event only in b sits just after the last paired event before it. One that comes
    after the first value difference is not looked for: what differs there may follow
    from that difference (autocast's backward pairs its casts' gradients differently)."""
    best = (float(before), None, None, None) if before is not None else None
    for side in ("a", "b"):
        s, t = (d.sa, d.ta) if side == "a" else (d.sb, d.tb)
        own = d.al.a2b if side == "a" else d.al.b2a
        cand = np.flatnonzero((own < 0) & ~s.transparent & np.isin(s.kind, KINDS))
        if not len(cand):
            continue
        p, c = _consumers(t)
        paired = np.flatnonzero(own >= 0)
        for u in cand[:MAX_CANDIDATES].tolist():
            pos = _position(u, side, paired, own)
            if best is not None and pos >= best[0]:
                break
            if is_view(t.string(t.events["op"][u])):
                continue   # a view is not what changed the values: what wrote through it is
            hit = _reaches_changed(d, side, own, p, c, u)
            if hit:
                best = (pos, side, u, hit)
                break
    if best is None or best[1] is None:
        return None
    pos, side, u, consumers = best
    t = d.ta if side == "a" else d.tb
    ev = EventRef.from_event(t.event(u), dtypes=[t.string(r["dtype"]) for r in
                                                 t.value_rows(u, schema.ROLE_OUT)],
                             rank=getattr(t, "rank", None))
    users = [EventRef.from_event(t.event(e), rank=getattr(t, "rank", None))
             for e in consumers[:MAX_CONSUMERS]]
    own = d.al.a2b if side == "a" else d.al.b2a
    lo, hi = u, u
    while lo > 0 and own[lo - 1] < 0:
        lo -= 1
    while hi + 1 < len(own) and own[hi + 1] < 0:
        hi += 1
    where = ev.source.split(" ← ")[-1] if ev.source else ""
    text = f"only in {side}: {ev.op}" + (f" at {where}" if where else "") + \
        (f", rank {ev.rank}" if ev.rank is not None else "")
    return Structural(side=side, event=ev, consumers=users, position=float(pos),
                      gap={"side": side, "start": lo, "length": hi - lo + 1}, text=text)


def _position(u, side, paired, own):
    """Where event u of `side` sits in trace a's order."""
    if side == "a":
        return float(u)
    i = int(np.searchsorted(paired, u)) - 1
    return (float(own[paired[i]]) if i >= 0 else -1.0) + 0.5


def _reaches_changed(d, side, own, p, c, u):
    """The paired consumers (events of `side`) reached from u through unpaired events whose
    inputs differ bitwise; [] when none."""
    seen, todo, hit = {u}, [u], []
    while todo and len(seen) < MAX_REACH:
        e = todo.pop(0)
        for k in _users(p, c, e):
            if k in seen:
                continue
            seen.add(k)
            if own[k] < 0:
                todo.append(k)
                continue
            ea, eb = (k, int(own[k])) if side == "a" else (int(own[k]), k)
            if d.inputs_match(ea, eb, BITWISE)[0] is False:
                hit.append(k)
    return sorted(hit)
