"""Divergence over time: per optimizer step, how far the parameters and the loss of the
two runs are apart (`tracediff explain`'s last table).

The parameters come from locate's optimizer steps; the loss is found without knowing the
script: the last scalar float output of a paired forward computation in each step (a
train step returns (..., loss)), constants (the backward seed, fills, factories) excluded.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace import schema
from .result import LocateResult, Loss, StepRow

_CONSTANT_OPS = re.compile(r"^(aten::)?(ones|zeros|full|fill|empty|scalar_tensor|arange|linspace|"
                           r"rand|randn|randint|normal|uniform|bernoulli|lift|new_|iota|"
                           r"broadcast_in_dim$)")


def steps_table(d, result: LocateResult) -> list:
    """[StepRow] per step, in step order: the parameters' max rel (locate's optimizer
    steps) and the loss of a and b."""
    rows = {r.step: StepRow(step=r.step, optimizer=r) for r in result.optimizer_steps}
    t = d.ta
    ev = t.events
    n = len(ev)
    if not n:
        return list(rows.values())
    kinds = ev["kind"].astype(np.int64)
    phase = ev["phase"].astype(np.int64)
    cand = np.flatnonzero(np.isin(kinds, (schema.KIND_CALL, schema.KIND_OP, schema.KIND_EAGER)) &
                          (phase == schema.PHASE_FWD) & (d.al.a2b >= 0))
    vals = t.values
    out0 = vals[(vals["role"] == schema.ROLE_OUT)]
    scalar = np.zeros(n, bool)
    shape_empty = np.array([t.string(s) == "" for s in out0["shape"]], bool) if len(out0) else \
        np.zeros(0, bool)
    isfloat = np.array([t.string(x).startswith("float") for x in out0["dtype"]], bool) \
        if len(out0) else np.zeros(0, bool)
    ok = shape_empty & isfloat & ((out0["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT))
                                  == 0)
    scalar[out0["event"][ok].astype(np.int64)] = True
    cand = cand[scalar[cand]]
    # constants are not a loss: the backward seed (ones_like), fills, factories
    const = np.array([bool(_CONSTANT_OPS.match(t.string(o))) for o in ev["op"][cand]], bool) \
        if len(cand) else np.zeros(0, bool)
    cand = cand[~const]
    steps = ev["step"].astype(np.int64)
    for s in np.unique(steps[cand]).tolist():
        ea = int(cand[steps[cand] == s][-1])
        eb = int(d.al.a2b[ea])
        rows_a = [r for r in t.value_rows(ea, schema.ROLE_OUT) if t.string(r["shape"]) == ""]
        rows_b = [r for r in d.tb.value_rows(eb, schema.ROLE_OUT) if d.tb.string(r["shape"]) == ""]
        if not rows_a or not rows_b:
            continue
        # the last scalar output (a train step returns (..., loss))
        ra_, rb_ = rows_a[-1], rows_b[-1]
        xa, xb = d.ra.read(ra_), d.rb.read(rb_)
        if xa is None or xb is None:
            continue
        la, lb = float(np.real(xa)), float(np.real(xb))
        rel = abs(la - lb) / max(abs(la), abs(lb)) if la != lb and max(abs(la), abs(lb)) else 0.0
        row = rows.setdefault(s, StepRow(step=s))
        e = t.event(ea)
        row.loss = Loss(a=la, b=lb, rel=rel, event=ea, op=e["op"], source=e["source"])
    return [rows[k] for k in sorted(rows)]
