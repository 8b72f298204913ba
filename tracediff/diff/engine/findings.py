"""What a located event becomes: the typed `Finding` (metrics, values, inputs verdict,
devices, arguments, dtype note, optimizer label) and the per-step optimizer table.
"""

import math

import numpy as np

from ...trace import schema
from ...trace.values import has_bytes as comparable, parse_shape
from ..align import optroles
from ..compare import args as _args
from ..compare import devices as _devices
from ..compare import dtypes as _dtypes
from ..compare import values as compare
from ..result import EventRef, Finding, Metrics, OptimizerStep, ValueComparison, ValueDesc


class FindingBuilder:
    """Findings and optimizer steps of paired events (see the module docstring)."""

    def finding(self, ea, eb, level, note=""):
        """The typed `Finding` of a paired event at one level."""
        r = self.compare_event(ea, eb)
        ok, reason, bad = self.inputs_match(ea, eb, level)
        if ok is False and bad:
            reason += ": " + _inputs_named(bad)
        bitwise = ok if level == compare.BITWISE or ok is False else None
        if ok is True and level != compare.BITWISE and self.judges_inputs_bitwise(ea, eb):
            # within tolerance is not equal: an op reading inputs that differ bitwise did
            # not introduce the difference on its own, whatever its output shows
            bitwise, _, bad = self.inputs_match(ea, eb, compare.BITWISE)
            if bitwise is False and bad:
                which = "it differs" if len(bad) == 1 else f"{len(bad)} of them differ"
                reason = f"{reason}, but {which} bitwise: {_inputs_named(bad)}"
        per_device, device_note = _devices.spread(self.ta, self.tb, ea, eb)
        ref_a, ref_b = _event(self.ta, ea, self.sa), _event(self.tb, eb, self.sb)
        return Finding(level=level, a=ref_a, b=ref_b,
                       metrics=Metrics.from_dict(r["metrics"]),
                       values=[_value_comparison(v) for v in r["values"]], inputs_match=ok,
                       inputs_reason=reason, inputs_bitwise=bitwise,
                       origin=schema.ORIGIN_NAMES.get(int(self.ta.events[ea]["origin"]), ""),
                       note=note, pair_by=self.pair_by.get(ea, "structure"),
                       devices=per_device, device_note=device_note,
                       optimizer=self._op_label(ea), arguments=self.arguments(ea, eb),
                       dtype_note=_dtypes.dtype_note(self.ta, self.tb, ea, eb, ref_a.dtypes,
                                                     ref_b.dtypes))

    def judges_inputs_bitwise(self, ea, eb):
        """Whether inputs that differ bitwise (within tolerance) keep a pair from being the
        op that introduced a difference: yes for two runs of one program; no where the two
        sides compute a value differently by design (two frameworks, eager against a
        compiled decomposition: `pairing/`), whose inputs never agree bitwise."""
        return True

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
    def _params_after(self, steps, i):
        """[(name, row_a, row_b, arrays)] of the parameters after the i-th paired optimizer
        step (`arrays`: (a, b, dtype) when computed here, else None: compare the rows).
        torch snapshots them after the step; optax's snapshot holds the params `update`
        was given (before the step) and the updates, so after step N is the params of the
        snapshot of step N + 1 (what the program carried on with) or, for the last step,
        params + updates as optax.apply_updates computes them (both sides' bytes needed;
        without them params and updates are compared by hash and statistics)."""
        ea, eb = steps[i]
        pairs = self._out_pairs(ea, eb)
        if self.ta.string(self.ta.events["op"][ea]) != "optim:optax":
            return [(k, ra, rb, None) for k, ra, rb in
                    ([p for p in pairs if str(p[0]).startswith("params/")] or pairs)]
        step = int(self.ta.events["step"][ea])
        if i + 1 < len(steps):
            na, nb = steps[i + 1]
            if int(self.ta.events["step"][na]) == step + 1 and \
                    int(self.tb.events["step"][nb]) == int(self.tb.events["step"][eb]) + 1:
                nxt = [(k, ra, rb, None) for k, ra, rb in self._out_pairs(na, nb)
                       if str(k).startswith("params/")]
                if nxt:
                    return nxt
        updates = {str(k)[len("updates/"):]: (ra, rb) for k, ra, rb in pairs
                   if str(k).startswith("updates/")}
        out = []
        for k, pa, pb in pairs:
            if not str(k).startswith("params/"):
                continue
            ua, ub = updates.get(str(k)[len("params/"):], (None, None))
            rows = (pa, pb, ua, ub)
            if any(r is None for r in rows):
                out.append((k, pa, pb, None))
            elif all(comparable(r) for r in rows):
                xa = _apply_update(self.ra.read(pa), self.ra.read(ua))
                xb = _apply_update(self.rb.read(pb), self.rb.read(ub))
                out.append((k, pa, pb, (xa, xb, self.ta.string(pa["dtype"]))))
            else:
                out += [(k, pa, pb, None), (f"updates/{str(k)[len('params/'):]}", ua, ub, None)]
        return out or [(k, ra, rb, None) for k, ra, rb in pairs]

    def _judge(self, row_a, row_b, arrays):
        """Metrics of a parameter after the step: of the rows, or of the arrays computed."""
        if arrays is None:
            return self.compare_rows(row_a, row_b)
        xa, xb, dtype = arrays
        m = compare.compare_arrays(xa, xb, dtype, self.rtol, self.atol, ulp=self.ulp)
        m["bitwise_equal"] = bool(xa.shape == xb.shape and xa.tobytes() == xb.tobytes())
        return m

    def _optimizer_pairs(self):
        """[(a event, b event)] of the paired optimizer steps, in order."""
        ia, ib = self.pairs()
        sel = self.sa.kind[ia] == schema.KIND_OPTIM
        return list(zip(ia[sel].tolist(), ib[sel].tolist()))

    def initial_and_final_parameters(self):
        """[(name, init_a, init_b, final_a, final_b)] float64 arrays of the parameters both
        sides start from and end with, where both are optax runs (an optax snapshot holds
        the params `update` was given: the first step's are the initial ones) with bytes
        on both sides; [] otherwise (a torch snapshot is taken after its step: it never
        holds the initial parameters). The sources' estimator follows the initialiser's
        difference to the end with them."""
        steps = self._optimizer_pairs()
        if not steps or any(t.string(t.events["op"][e]) != "optim:optax"
                            for t, e in ((self.ta, steps[0][0]), (self.tb, steps[0][1]))):
            return []
        first = {str(k): (ra, rb) for k, ra, rb in self._out_pairs(*steps[0])
                 if str(k).startswith("params/")}
        out = []
        for k, ra, rb, arrays in self._params_after(steps, len(steps) - 1):
            init = first.get(str(k))
            if init is None or ra is None or rb is None or not all(
                    comparable(r) for r in (*init, *((ra, rb) if arrays is None else ()))):
                continue
            fa, fb = (self.ra.read(ra), self.rb.read(rb)) if arrays is None else arrays[:2]
            xs = [np.asarray(x, dtype=np.float64)
                  for x in (self.ra.read(init[0]), self.rb.read(init[1]), fa, fb)]
            if len({x.shape for x in xs}) == 1:
                out.append((str(k), *xs))
        return out

    def optimizer_steps(self):
        """Per optimizer step, the parameters after the step (`_params_after`: the same
        moment in torch and optax) compared: relative L2, max abs, the worst tensor."""
        steps = self._optimizer_pairs()
        rows = []
        for i, (ea, eb) in enumerate(steps):
            names = self._params_after(steps, i)
            max_rel, max_abs, bit = 0.0, 0.0, True
            worst = (-1.0, None, None, None)   # (own rel L2, name, max abs, max rel)
            l2, read, same, by_rel = compare.RelL2(), False, [], None
            unmeasured = False   # a differing tensor known only by hash and statistics
            for k, row_a, row_b, arrays in names:
                if row_a is None or row_b is None:
                    continue
                m = self._judge(row_a, row_b, arrays)
                if m is None:
                    continue
                read = True
                bit &= m["bitwise_equal"]
                rel, dabs = _worst_first(m.get("max_rel")), _worst_first(m.get("max_abs"))
                if not m["bitwise_equal"] and (by_rel is None or rel > max_rel):
                    by_rel = str(k)   # named when no differing tensor has bytes to compare
                max_rel, max_abs = max(max_rel, rel), max(max_abs, dabs)
                if not (comparable(row_a) and comparable(row_b)):
                    unmeasured |= not m["bitwise_equal"]
                    continue
                if m["bitwise_equal"]:   # only its ||a|| counts in the step's figure
                    same.append(row_a if arrays is None else arrays[0])
                    continue
                # ||a - b|| / ||a|| of this tensor, and summed into the step's figure
                if arrays is None:
                    xa, xb = self.ra.read(row_a), self.rb.read(row_b)
                    xb = self.transform_b(row_a, row_b, xa, xb)
                else:
                    xa, xb = arrays[0], arrays[1]
                own = compare.RelL2()
                own.add(xa, xb)
                l2.add(xa, xb)
                v = own.value()
                if v is not None and v > worst[0]:
                    worst = (v, str(k), dabs, rel)
            if not bit:
                for row_a in same:
                    xa = row_a if isinstance(row_a, np.ndarray) else self.ra.read(row_a)
                    l2.add(xa, xa)
            rows.append(OptimizerStep(step=int(self.ta.events[ea]["step"]), a=ea, b=eb,
                                      bitwise_equal=bool(bit),
                                      max_rel=None if unmeasured else max_rel,
                                      max_abs=max_abs, worst=worst[1] or by_rel,
                                      rel_l2=l2.value() if read and not unmeasured else None,
                                      worst_rel_l2=worst[0] if worst[1] is not None else None,
                                      worst_max_abs=worst[2],
                                      max_abs_is_lower_bound=True if unmeasured else None))
        return rows


def _inputs_named(bad):
    """"input 0 from aten::mul (event 12), input 1" for the first three inputs of `bad`."""
    return ", ".join(f"input {d['input']}" + (f" from {d['producer_op']} (event {d['producer_a']})"
                                             if "producer_op" in d else "") for d in bad[:3])


def _apply_update(p, u):
    """The parameter after an optax step, as optax.apply_updates computes it: p + u in the
    promoted dtype, cast back to the parameter's."""
    p, u = np.asarray(p), np.asarray(u)
    with np.errstate(all="ignore"):
        return np.asarray(p + u).astype(p.dtype)


def _worst_first(x):
    """A metric for ranking parameters: not computed counts as 0, NaN as the worst (inf)."""
    if x is None:
        return 0.0
    return math.inf if math.isnan(x) else float(x)


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
