"""Judging a paired event's inputs: do the values it read match on both sides (dataflow
edges and the values stored on the event), read through a cast only one side ran?

`InputJudgement` is the part of `Differ` (`diff/differ.py`) that tells an origin (inputs
match, outputs differ) from an event that only carries a difference on.
"""

from ...trace import schema
from ..compare import values as compare
from ..compare.values import BITWISE
from .values import _pair_rows


class InputJudgement:
    """The inputs of paired events compared (see the module docstring)."""

    def _weakest_input_dtype(self, ea):
        """The least precise floating dtype among the values event `ea` of a reads: an
        output cannot be held to a tighter tolerance than its inputs (a float32 value
        converted to float64 keeps its float32 error)."""
        names = set()
        for row in self.ta.value_rows(ea, schema.ROLE_IN):
            names.add(self.ta.string(row["dtype"]))
        for r in self.ta.input_rows(ea):
            p = int(r["producer"])
            if 0 <= p < len(self.ta.events):
                row = input_value_row(self.sa, self.ta, ea, p, int(r["producer_slot"]))
                if row is not None:
                    names.add(self.ta.string(row["dtype"]))
        names = [n for n in names if compare.is_floating(n)]
        if not names:
            return None
        return max(names, key=lambda n: compare.tolerance(n)[0])

    def _read_through_cast(self, p, ps, q, qs):
        """"float32 -> bfloat16" when one side's producer (p of a, q of b) is a dtype or
        layout conversion that only that side ran (`align.TRANSPARENT_OPS`, unpaired) and
        what it converted is bitwise the value the other side read; else None."""
        for side, s, t, own, ev, slot, other, oslot in (
                ("b", self.sb, self.tb, self.al.b2a, q, qs, p, ps),
                ("a", self.sa, self.ta, self.al.a2b, p, ps, q, qs)):
            if ev < 0 or ev >= len(own) or own[ev] >= 0 or other < 0 or \
                    getattr(s, "transparent", None) is None or not s.transparent[ev]:
                continue
            rows = [r for r in t.input_rows(ev) if int(r["slot"]) == 0]
            if not rows or int(rows[0]["producer"]) < 0:
                continue
            src, src_slot = int(rows[0]["producer"]), int(rows[0]["producer_slot"])
            mine, theirs = (self.sb, self.sa) if side == "b" else (self.sa, self.sb)
            row_o = theirs.value_row(other, oslot)
            row_s, row_c = mine.value_row(src, src_slot), mine.value_row(ev, slot)
            ta_, tb_ = (row_o, row_s) if side == "b" else (row_s, row_o)
            if ta_ is None or tb_ is None or row_c is None:
                continue
            m = self.compare_rows(ta_, tb_)
            if m is None or not m["bitwise_equal"]:
                continue
            before, after = t.string(row_s["dtype"]), t.string(row_c["dtype"])
            return f"{before} -> {after}" if before != after else f"{before}, {t.string(t.events[ev]['op'])}"
        return None

    def inputs_match(self, ea, eb, level):
        """(True/False/None, reason, [mismatching input descriptions])."""
        bad, unknown = [], []
        checked = 0
        # role-IN values stored on the event itself (a call's arguments, an equation's
        # literals); a slot that also has a dataflow edge is judged by the edge, with the
        # role-IN values as the fallback when the producer's value was not stored
        ina = self.ta.value_rows(ea, schema.ROLE_IN)
        inb = self.tb.value_rows(eb, schema.ROLE_IN)
        own = {k: (row_a, row_b) for k, row_a, row_b in
               _pair_rows(self.ta, self.tb, ina, inb, by_name=False)}
        edges = {int(r["slot"]) for r in self.ta.input_rows(ea) if int(r["producer"]) >= 0}

        casts = []

        def judge(key, m, extra):
            nonlocal checked
            checked += 1
            if m.get("cast_only"):   # the same value in another dtype: a cast, not a difference
                casts.append(f"{key} ({m['dtype_mismatch'][0]} -> {m['dtype_mismatch'][1]})")
                return
            if not (m["bitwise_equal"] if level == BITWISE else m["within_tolerance"]):
                bad.append(dict(extra, input=key, metrics=m))

        def own_value(k):
            """Judge slot k by the values stored on the event; False when it cannot."""
            row_a, row_b = own.get(k, (None, None))
            m = self.compare_rows(row_a, row_b) if row_a is not None and row_b is not None \
                else None
            if m is not None:
                judge(str(k), m, {})
            return m is not None

        for k, (row_a, row_b) in own.items():
            if k in edges:
                continue
            if row_a is None or row_b is None:
                unknown.append(f"input {k} is recorded on one side only")
            elif not own_value(k):
                unknown.append(f"input {k} was not stored")
        # dataflow edges
        rows_a = self.ta.input_rows(ea)
        # a slot has several rows when an event reads one value per device (a collective
        # replayed per device, capture/jax/devices.py): paired in order
        rows_b, seen_b = {}, {}
        for r in self.tb.input_rows(eb):
            k = int(r["slot"])
            rows_b[(k, seen_b.get(k, 0))] = r
            seen_b[k] = seen_b.get(k, 0) + 1
        seen_a = {}
        for r in rows_a:
            slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
            nth = seen_a.get(slot, 0)
            seen_a[slot] = nth + 1
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            if p == schema.PRODUCER_UNKNOWN:
                if slot not in own:
                    unknown.append(f"input {slot} has an unknown producer")
                continue
            rb = rows_b.get((slot, nth))
            q, qs = (int(rb["producer"]), int(rb["producer_slot"])) if rb is not None else (-1, 0)
            va = input_value_row(self.sa, self.ta, ea, p, ps)
            vb = input_value_row(self.sb, self.tb, eb, q, qs) if q >= 0 else None
            cast = self._read_through_cast(p, ps, q, qs)
            if cast is not None:   # one side casts what both read: a cast, not a difference
                casts.append(f"{slot} ({cast})")
                checked += 1
                continue
            m = self.compare_rows(va, vb) if va is not None and vb is not None else None
            if m is None:
                if own_value(slot):
                    continue
                unknown.append(f"input {slot} has no counterpart in b" if rb is None else
                               f"input {slot} comes from event {p} in a but has no producer "
                               f"in b" if q < 0 else f"input {slot} (from event {p}) was not stored")
                continue
            judge(slot, m, {"producer_a": p, "producer_b": q,
                            "producer_op": self.ta.string(self.ta.events[p]["op"])})
        if bad:
            return False, (f"{len(bad)} of its inputs differ "
                           f"{'bitwise' if level == BITWISE else 'beyond tolerance'}"), bad
        if unknown:
            return None, "; ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else ""), []
        if checked == 0:
            return True, "it reads no recorded inputs", []
        if casts:
            return True, (f"its inputs match up to a dtype cast of input "
                          f"{', '.join(casts[:3])}{' ...' if len(casts) > 3 else ''}"), []
        return True, (f"its input matches ({_level_word(level)})" if checked == 1 else
                      f"all {checked} inputs match ({_level_word(level)})"), []

    def input_pairs(self, ea, eb):
        """[(slot, row_a, row_b)] of the dataflow inputs of two paired events (the
        values `inputs_match` compares; None rows where a side has none)."""
        rows_b = {}
        for r in self.tb.input_rows(eb):
            rows_b.setdefault(int(r["slot"]), r)
        out = []
        for r in self.ta.input_rows(ea):
            slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            rb = rows_b.get(slot)
            if p < 0 or rb is None or int(rb["producer"]) < 0:
                out.append((slot, None, None))
                continue
            out.append((slot, input_value_row(self.sa, self.ta, ea, p, ps),
                        input_value_row(self.sb, self.tb, eb, int(rb["producer"]),
                                        int(rb["producer_slot"]))))
        return out


def input_value_row(side, trace, ev, prod, pslot):
    """The value row an input slot read: producer output, or the call's role-IN value
    when an equation reads its enclosing call's argument."""
    if prod < 0 or prod >= len(trace.events):
        return None
    if side.kind[prod] == schema.KIND_CALL and side.call[ev] == prod:
        row = side.value_row(prod, pslot, schema.ROLE_IN)
        if row is not None:
            return row
    return side.value_row(prod, pslot, schema.ROLE_OUT)


def _level_word(level):
    return "bitwise" if level == BITWISE else "within tolerance"
