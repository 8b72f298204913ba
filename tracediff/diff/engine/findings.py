"""What a located event becomes: the typed `Finding` (metrics, values, inputs verdict,
devices, arguments, dtype note, optimizer label) and the per-step optimizer table.
"""

import math

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
            reason += ": " + ", ".join(
                f"input {d['input']}" + (f" from {d['producer_op']} (event {d['producer_a']})"
                                         if "producer_op" in d else "") for d in bad[:3])
        per_device, device_note = _devices.spread(self.ta, self.tb, ea, eb)
        ref_a, ref_b = _event(self.ta, ea, self.sa), _event(self.tb, eb, self.sb)
        return Finding(level=level, a=ref_a, b=ref_b,
                       metrics=Metrics.from_dict(r["metrics"]),
                       values=[_value_comparison(v) for v in r["values"]], inputs_match=ok,
                       inputs_reason=reason,
                       origin=schema.ORIGIN_NAMES.get(int(self.ta.events[ea]["origin"]), ""),
                       note=note, pair_by=self.pair_by.get(ea, "structure"),
                       devices=per_device, device_note=device_note,
                       optimizer=self._op_label(ea), arguments=self.arguments(ea, eb),
                       dtype_note=_dtypes.dtype_note(self.ta, self.tb, ea, eb, ref_a.dtypes,
                                                     ref_b.dtypes))

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
    def optimizer_steps(self):
        ia, ib = self.pairs()
        sel = self.sa.kind[ia] == schema.KIND_OPTIM
        rows = []
        for ea, eb in zip(ia[sel].tolist(), ib[sel].tolist()):
            pairs = self._out_pairs(ea, eb)
            names = [p for p in pairs if str(p[0]).startswith("params/")] or pairs
            max_rel, max_abs, bit = 0.0, 0.0, True
            worst = (-1.0, None, None, None)   # (own rel L2, name, max abs, max rel)
            l2, read, same, by_rel = compare.RelL2(), False, [], None
            unmeasured = False   # a differing tensor known only by hash and statistics
            for k, row_a, row_b in names:
                if row_a is None or row_b is None:
                    continue
                m = self.compare_rows(row_a, row_b)
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
                    same.append(row_a)
                    continue
                # ||a - b|| / ||a|| of this tensor, and summed into the step's figure
                xa, xb = self.ra.read(row_a), self.rb.read(row_b)
                xb = self.transform_b(row_a, row_b, xa, xb)
                own = compare.RelL2()
                own.add(xa, xb)
                l2.add(xa, xb)
                v = own.value()
                if v is not None and v > worst[0]:
                    worst = (v, str(k), dabs, rel)
            if not bit:
                for row_a in same:
                    xa = self.ra.read(row_a)
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
