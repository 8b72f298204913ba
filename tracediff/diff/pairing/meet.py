"""Where a finding is reported when the two sides compute a module by different formulas.

Why: Flax's RMSNorm divides by `sqrt(var + eps)` where torch multiplies by `rsqrt(var +
eps)`; Flax scales q before the matmul where torch scales the scores; an activation is
written with other ops. Where the values meet inside the module, the pairing pairs them
there ("values meet"). Where they do not (a port bug inside the module), the pairing keeps
the dataflow going by pairing the last ops of the same size ("dataflow (composite)"), but
those two values may be different quantities (a square root and its reciprocal, 0.417
apart where the module's output is 0.0018 apart). A difference found at such a pair is
reported where the values should meet again: the first later pair of the module, on both
sides, that is not a composite (the same op read from paired values), else the module's
last pair (its output), with that point's magnitude; its inputs are those of the whole
span, so a difference made inside the module is "introduced here". Forward pairs only: a
backward composite (one term of a gradient against a whole fused backward) is a pairing
question of its own.

Where the two ops of one family read the same values and differ while the module's output
differs too (an activation written with other ops), the headline is the module's output
too, the op named inside it (`_formulas_differ`).
"""

from .graph import PHASE_BWD
from .layers import REGION_PAIRS, _finite, _num, within

COMPOSITE = "dataflow (composite)"


class FormulaMeeting:
    """The meeting point of a composite pair and the inputs of its span (see the module
    docstring), for `CrossDiffer.search` and `inputs_match`."""

    def meeting_point(self, i):
        """(j, span) for the i-th entry of `pairs_list`: j the entry the finding is reported
        at (i itself unless its pair is a composite), span the pair indices from i to j that
        lie inside the module on both sides (what the reported finding computed)."""
        k0 = self.pairs_list[i][1]
        pr = self.p.pairs[k0]
        if pr.by != COMPOSITE:
            return i, [k0]
        ma, mb = pr.modules or (self.p.unit_module(0, pr.a), self.p.unit_module(1, pr.b))
        j, span = i, [k0]
        for jj in range(i + 1, len(self.pairs_list)):
            k = self.pairs_list[jj][1]
            q = self.p.pairs[k]
            if not within(self.p.unit_module(0, q.a), ma):
                break
            if not within(self.p.unit_module(1, q.b), mb):
                continue
            j = jj
            span.append(k)
            if q.by != COMPOSITE:
                break
        return j, span

    def move_to_meeting(self, i, level):
        """(i, pair, pair found, note opening) of a difference found at the i-th entry of
        `pairs_list`, moved to its meeting point (`meeting_point`); pair None where the
        values agree there at `level` (no finding). The pair found is where `inside` looks
        for the first op that meets none of the other side's."""
        pr = self.p.pairs[self.pairs_list[i][1]]
        j, span = self.meeting_point(i)
        if j == i:
            return i, pr, pr, ""
        q = self.p.pairs[self.pairs_list[j][1]]
        ea, eb = self.ga.units[q.a].rep, self.gb.units[q.b].rep
        if self.equal_at(ea, eb, level):
            return j, None, pr, ""
        self._spans[ea] = span
        return j, q, pr, self._moved_text(pr, span)

    def input_entries(self, ea, ka, kb):
        """What paired units ka, kb (event ea of a) read, matched (`_unit_input_pairs`); for
        a finding moved to a meeting point, what its whole span reads."""
        span = self._spans.get(ea)
        if span is not None:
            return self.span_input_pairs(span)
        region = self.p.pairs[self.p.pair_of[0][ka]].by in REGION_PAIRS \
            if ka in self.p.pair_of[0] else False
        return self._unit_input_pairs(ka, kb, region)

    def span_input_pairs(self, span):
        """What the pairs of a span read from outside it, matched as `_unit_input_pairs`
        matches one pair's (values made by pairs of the span are inside)."""
        inside, seen, out = set(span), set(), []
        for k in span:
            q = self.p.pairs[k]
            for entry in self._unit_input_pairs(q.a, q.b, q.by in REGION_PAIRS):
                row, _, key, _ = entry
                if key is not None and key[0] == "pair" and key[1] in inside:
                    continue
                ident = key if key is not None else \
                    ("row", None if row is None else int(row["offset"]))
                if ident in seen:
                    continue
                seen.add(ident)
                out.append(entry)
        return out

    def _gradient_meets(self, pr, mod, level):
        """A backward pair that differs inside a module whose last pair (in a's order, its
        input gradient) agrees at `level`: the two sides' backward formulas differ inside
        (Flax's transpose of `x / sqrt(v)` against torch's RsqrtBackward0 and MulBackward0:
        other terms of other sums), and the values meet at the module's gradient; a
        parameter's gradient is compared at the optimizer's snapshot (`roles.py`)."""
        if mod is None or self.ga.units[pr.a].phase != PHASE_BWD:
            return False
        ea, eb = self.ga.units[pr.a].rep, self.gb.units[pr.b].rep
        if (mod["a_event"], mod["b_event"]) == (ea, eb):
            return False
        return self.equal_at(mod["a_event"], mod["b_event"], level)

    def _formulas_differ(self, f, pr, mod, level):
        """Two ops of one family read the same values and differ inside a module whose
        output differs too (an activation written with other ops: Flax's exact GELU
        `0.5 * x` against torch's QuickGELU `1.702 * x`): the two formulas differ, and the
        headline is the module's output with its magnitude; the op is named inside. None
        where the op is the module's output or its inputs do not all match."""
        if mod is None or pr.by != "dataflow" or f.inputs_match is not True:
            return None
        ea, eb = self.ga.units[pr.a].rep, self.gb.units[pr.b].rep
        oa, ob = mod["a_event"], mod["b_event"]
        if (oa, ob) == (ea, eb) or self.equal_at(oa, ob, level):
            return None
        k = next((k for e, k in self.pairs_list if e == oa), None)
        if k is None:
            return None
        po = self.p.pairs[k]
        m = self.compare_event(ea, eb)["metrics"]
        out = self.finding(oa, ob, level, note=self._note(po))
        out.layer = self.layer(po)
        out.layer["module"] = mod
        out.layer["inside"] = {"a": int(ea), "b": int(eb), "a_op": self.ga.units[pr.a].label,
                               "b_op": self.gb.units[pr.b].label,
                               "max_abs": _finite(m.get("max_abs")),
                               "max_rel": _finite(m.get("max_rel"))}
        out.note += (f"; the module's two formulas differ inside it: a {self.ga.units[pr.a].label} "
                     f"(event {ea}) and b {self.gb.units[pr.b].label} (event {eb}) read the same "
                     f"values and differ by max abs {_num(m.get('max_abs')):.3g}; the module's "
                     f"output {mod['a'] or '(top level)'} <-> {mod['b'] or '(top level)'} is the "
                     f"headline")
        return out

    def _moved_text(self, pr, span):
        """The note's opening for a finding moved from composite pair `pr` along `span`."""
        ma, mb = pr.modules or (self.p.unit_module(0, pr.a), self.p.unit_module(1, pr.b))
        comp = [self.p.pairs[k] for k in span if self.p.pairs[k].by == COMPOSITE]
        ops_a = ", ".join(self._region_label(0, q.a) for q in comp)
        ops_b = ", ".join(self._region_label(1, q.b) for q in comp)
        return (f"a and b compute {ma or '(top level)'} <-> {mb or '(top level)'} by different "
                f"formulas whose values do not meet inside (a {ops_a}; b {ops_b}, events "
                f"{self.ga.units[pr.a].rep} <-> {self.gb.units[pr.b].rep}): compared where they "
                f"should meet again, the same op read from paired values or the module's "
                f"output, its inputs those of the whole span; ")
