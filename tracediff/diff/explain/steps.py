"""Divergence over time: per optimizer step, how far the parameters and the loss of the
two runs are apart (`tracediff explain`'s last table).

The parameters come from locate's optimizer steps (max abs and the relative L2 distance
of all parameters). The loss is shown only where the trace says which value is the loss
(a scalar that merely comes last is not one: a `mul` output read as "loss a 28"):

* torch: the scalar passed to `backward()`, the input of the backward seed (the forward
  `ones_like` whose output a backward op consumes);
* JAX: the value the differentiated function returned (`value_and_grad`'s value): the
  last scalar float computed under its `jvp(...)` name stack, not its `transpose(...)`.

No such value: no loss column (never a made-up one).
"""

from __future__ import annotations

import re

import numpy as np

from ...trace import schema
from ..result import LocateResult, Loss, StepRow

_SEED = re.compile(r"^(aten::)?ones_like")
_JVP = re.compile(r"(^|/)jvp\(")
LOSS_TORCH = "passed to backward()"
LOSS_JAX = "returned by the differentiated function"


def _scalar_float_out(t, n):
    """bool per event: it has a stored scalar float output."""
    vals = t.values
    out0 = vals[vals["role"] == schema.ROLE_OUT]
    mask = np.zeros(n, bool)
    if not len(out0):
        return mask
    shape_empty = np.array([t.string(x) == "" for x in out0["shape"]], bool)
    isfloat = np.array([t.string(x).startswith("float") for x in out0["dtype"]], bool)
    ok = shape_empty & isfloat & ((out0["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT))
                                  == 0)
    mask[out0["event"][ok].astype(np.int64)] = True
    return mask


def loss_events(t):
    """{step: (event, how)}: the event of trace `t` whose scalar output is the loss of that
    step, and how it is known to be the loss (see the module docstring)."""
    ev = t.events
    n = len(ev)
    if not n:
        return {}
    scalar = _scalar_float_out(t, n)
    steps = ev["step"].astype(np.int64)
    phase = ev["phase"].astype(np.int64)
    ops = ev["op"]
    out = {}
    # torch: the backward seed's input
    uniq = {int(o): t.string(o) for o in np.unique(ops).tolist()}
    seed_ops = [o for o, name in uniq.items() if _SEED.match(name)]
    if seed_ops:
        inp = t.inputs
        seeds = np.flatnonzero(np.isin(ops, seed_ops) & (phase == schema.PHASE_FWD))
        if len(seeds):
            consumers = inp[np.isin(inp["producer"], seeds)]
            bwd = consumers[phase[consumers["event"].astype(np.int64)] == schema.PHASE_BWD]
            for sd in np.unique(bwd["producer"]).tolist():
                src = inp[(inp["event"] == sd) & (inp["slot"] == 0)]
                if len(src) and 0 <= int(src["producer"][0]) < n and scalar[int(src["producer"][0])]:
                    p = int(src["producer"][0])
                    out[int(steps[p])] = (p, LOSS_TORCH)
    # JAX: the differentiated function's value
    stacks = {int(x): t.string(x) for x in np.unique(ev["name_stack"]).tolist()}
    jvp = [k for k, v in stacks.items() if _JVP.search(v) and "transpose(" not in v]
    if jvp:
        cand = np.flatnonzero(np.isin(ev["name_stack"], jvp) & scalar &
                              (phase == schema.PHASE_FWD))
        for s_ in np.unique(steps[cand]).tolist():
            if s_ not in out:
                out[int(s_)] = (int(cand[steps[cand] == s_][-1]), LOSS_JAX)
    return out


def steps_table(d, result: LocateResult) -> list:
    """[StepRow] per step, in step order: the parameters' distance (locate's optimizer
    steps) and, where the trace names it, the loss of a and b."""
    rows = {r.step: StepRow(step=r.step, optimizer=r) for r in result.optimizer_steps}
    t = d.ta
    for s, (ea, how) in sorted(loss_events(t).items()):
        eb = int(d.al.a2b[ea])
        if eb < 0:
            continue
        rows_a = [r for r in t.value_rows(ea, schema.ROLE_OUT) if t.string(r["shape"]) == ""]
        rows_b = [r for r in d.tb.value_rows(eb, schema.ROLE_OUT) if d.tb.string(r["shape"]) == ""]
        if not rows_a or not rows_b:
            continue
        ra_, rb_ = rows_a[-1], rows_b[-1]
        xa, xb = d.ra.read(ra_), d.rb.read(rb_)
        if xa is None or xb is None:
            continue
        la, lb = float(np.real(xa)), float(np.real(xb))
        rel = abs(la - lb) / max(abs(la), abs(lb)) if la != lb and max(abs(la), abs(lb)) else 0.0
        row = rows.setdefault(s, StepRow(step=s))
        e = t.event(ea)
        row.loss = Loss(a=la, b=lb, rel=rel, event=ea, op=e["op"], source=e["source"], how=how)
    return [rows[k] for k in sorted(rows)]
