"""Where the pairing stops and the two sides' outputs differ: a divergence, bounded.

Why: a port bug can stop the pairing itself (a rotary table built with another base: each
side computes it from what only it has, the values disagree, so nothing that reads them
pairs). Every compared value then agrees, and the verdict was INCONCLUSIVE, though the
model's outputs differ by 1.2. The outputs are compared too: each side's last forward
result computed from the values both were handed. Where they differ, the divergence lies
in what was not paired, and at the latest from the first unpaired region on: its first op
and module on each side are named, with the outputs' magnitude (every pair downstream of
it agreed, so that is where the values meet again).
"""

from ..compare.values import BITWISE
from ..differ import comparable
from ..result import Metrics
from ...trace import schema
from .graph import PHASE_FWD, is_int, module_path, op_family
from .layers import _finite, _num
from .shapes import _one_shape

PAIRING_STOPS = "outputs (the pairing stops before them)"


class PairingStops:
    """`pairing_stops` for `locate.run` (see the module docstring)."""

    def pairing_stops(self, level):
        """A `Finding` at the two sides' outputs where they differ at `level` and are not a
        pair (a pair was searched already), its layer naming the first unpaired region;
        None where the outputs agree, are paired, or cannot be compared."""
        ka, kb = self._output_unit(0), self._output_unit(1)
        if ka is None or kb is None or ka in self.p.pair_of[0] or kb in self.p.pair_of[1]:
            return None
        ua, ub = self.ga.units[ka], self.gb.units[kb]
        if not _one_shape(ua.shape, ub.shape) or ua.family != ub.family or \
                self.p.groups[0][ka] != self.p.groups[1][kb] or \
                not self.p.modules_correspond(self.p.unit_module(0, ka), self.p.unit_module(1, kb)):
            return None     # not one quantity for certain (a loss against logits, modules a
            #                 user map keeps apart): no claim
        ea, eb = ua.rep, ub.rep
        if self.equal_at(ea, eb, level):
            return None
        m = self.compare_event(ea, eb)["metrics"]
        table = self._differing_table(level)
        if table is not None:
            return self._table_finding(table, level, ua, ub, m)
        ra, rb = self._first_unpaired(0), self._first_unpaired(1)
        if ra is None or rb is None:
            return None
        f = self.finding(ea, eb, level)
        ma, mb = self.p.unit_module(0, ra), self.p.unit_module(1, rb)
        oa, ob = self.ga.units[ra].label, self.gb.units[rb].label
        f.pair_by = PAIRING_STOPS
        f.inputs_match = f.inputs_bitwise = None
        f.inputs_reason = "not compared: the pairing stops before the outputs"
        f.layer = {
            "a": f"{oa} in {ma or '(top level)'}", "b": f"{ob} in {mb or '(top level)'}",
            "text": (f"first unpaired region: a {oa} in {ma or '(top level)'} (event "
                     f"{self.ga.units[ra].rep}) <-> b {ob} in {mb or '(top level)'} (event "
                     f"{self.gb.units[rb].rep})"),
            "family": self.ga.units[ra].family, "a_module": ma, "b_module": mb,
            "module": {"a": ma, "b": mb, "a_event": int(self.ga.units[ra].rep),
                       "b_event": int(self.gb.units[rb].rep),
                       "max_abs": _finite(m.get("max_abs")), "max_rel": _finite(m.get("max_rel"))},
            "outputs": {"a": int(ea), "b": int(eb), "a_op": ua.label, "b_op": ub.label}}
        f.note = (f"the pairing stops at the first unpaired region (a {oa} in "
                  f"{ma or '(top level)'}, b {ob} in {mb or '(top level)'}): every pair compared "
                  f"agrees, but the outputs differ, a {ua.label} (event {ea}) <-> b {ub.label} "
                  f"(event {eb}): max abs {_num(m.get('max_abs')):.3g}; the difference enters "
                  f"in what was not paired, from that region on")
        return f

    def _differing_table(self, level):
        """The first table paired by role (in a's order) whose values differ at `level`:
        (row a, row b, metrics), or None. Two values each side computes from what only it
        has (`near.py`) pair by role where ops of one family read them whose other inputs
        pair (the same atoms, values of paired units): the closest such b value for each a
        value."""
        best = {}
        for ka, ra, kb, rb, d in getattr(self.p, "tables", ()):
            if ka in self.p.atoms or kb in self.p.atoms or \
                    (ka in best and best[ka][2] <= d) or \
                    not self._readers(0, ka) & self._readers(1, kb):
                continue
            best[ka] = (ra, rb, d)
        for ra, rb, _ in sorted(best.values(), key=lambda v: int(v[0]["event"])):
            m = self.compare_rows(ra, rb)
            if m is not None and not (m["bitwise_equal"] if level == BITWISE
                                      else m["within_tolerance"]):
                return ra, rb, m
        return None

    def _readers(self, s, key):
        """{(op family, what else it reads)} of the forward units of side s reading the
        value of `key`, their other inputs as pair keys (`Reads._input_keys`); readers that
        read nothing else paired are left out."""
        memo = self.__dict__.setdefault("_table_readers", {})
        if (s, key) in memo:
            return memo[(s, key)]
        g = self.ga if s == 0 else self.gb
        out = set()
        for k, u in enumerate(g.units):
            if u.phase != PHASE_FWD:
                continue
            if any(g.nodes[nd][0] is not None and g.key(g.nodes[nd][0]) == key
                   for _, _, nd in g.input_nodes(u)):
                keys = frozenset(self.p._input_keys(s, k))
                if keys:
                    out.add((u.family, keys))
        memo[(s, key)] = out
        return out

    def _table_finding(self, table, level, ua, ub, out_metrics):
        """The finding at a table each side computes from what only it has, paired by role
        (its readers), whose values differ: the rotary cos of another base."""
        ra, rb, m = table
        ea, eb = int(ra["event"]), int(rb["event"])
        f = self.finding(ea, eb, level)
        f.metrics = Metrics.from_dict(m)
        f.values = []
        ma = module_path(self.ta.string(self.ta.events["name_stack"][ea]), self.fw_a)
        mb = module_path(self.tb.string(self.tb.events["name_stack"][eb]), self.fw_b)
        sa, sb = list(self.ga.shape(ra)), list(self.gb.shape(rb))
        oa, ob = _origin_op(self.ta, self.sa, ea), _origin_op(self.tb, self.sb, eb)
        f.pair_by = "role (a table each side computes, read by the same ops)"
        f.inputs_match = f.inputs_bitwise = None
        f.inputs_reason = ("a table each side computes from values of its own (constants, a "
                           "buffer, a numpy array): no input in common to compare")
        f.layer = {
            "a": f"{oa} {sa} in {ma or '(top level)'}", "b": f"{ob} {sb} in {mb or '(top level)'}",
            "text": (f"table {oa} {sa} in {ma or '(top level)'} <-> {ob} {sb} in "
                     f"{mb or '(top level)'}"),
            "family": "table", "a_module": ma, "b_module": mb,
            "module": {"a": ma, "b": mb, "a_event": ea, "b_event": eb,
                       "max_abs": _finite(m.get("max_abs")), "max_rel": _finite(m.get("max_rel"))},
            "table": {"a_shape": sa, "b_shape": sb},
            "outputs": {"a": int(ua.rep), "b": int(ub.rep), "a_op": ua.label, "b_op": ub.label,
                        "max_abs": _finite(out_metrics.get("max_abs"))}}
        f.note = (f"the tables differ: a {oa} {sa} (event {ea}) and b {ob} {sb} (event {eb}), "
                  f"each computed from values of its own side, are read by the same ops "
                  f"(paired by that role) and differ by max abs {_num(m.get('max_abs')):.3g}; "
                  f"nothing that reads them pairs, and the outputs differ, a {ua.label} "
                  f"(event {ua.rep}) <-> b {ub.label} (event {ub.rep}): max abs "
                  f"{_num(out_metrics.get('max_abs')):.3g}")
        return f

    def _output_unit(self, s):
        """The last forward unit of side s computed from values both sides hold (an atom in
        its support: not an init-time forward on constants), a float result: the model's
        output or loss."""
        g = self.ga if s == 0 else self.gb
        for k in range(len(g.units) - 1, -1, -1):
            u = g.units[k]
            if u.phase != PHASE_FWD or is_int(u.dtype) or not g.support[k] or \
                    not any(x[0] == "a" for x in g.support[k]):
                continue
            row = self.p.out_row(s, k)
            if row is not None and comparable(row):
                return k
        return None

    def _first_unpaired(self, s):
        """The first unpaired forward unit of side s, from the first pair on, that depends on
        values both sides hold (the first unpaired region after the paired frontier)."""
        g = self.ga if s == 0 else self.gb
        first = min((k for k in self.p.pair_of[s]), default=None)
        for k, u in enumerate(g.units):
            if u.phase != PHASE_FWD or k in self.p.pair_of[s] or \
                    (first is not None and k < first) or not g.support[k] or \
                    not any(x[0] == "a" for x in g.support[k]):
                continue
            return k
        return None


def _origin_op(t, side, e, hops=6):
    """The op that computed the value event `e` moved (`aten::cos` under its `unsqueeze`),
    else e's own op."""
    for _ in range(hops):
        if side.kind[e] == schema.KIND_INPUT or op_family(t.string(t.events[e]["op"])):
            break
        prods = [int(r["producer"]) for r in t.input_rows(e) if int(r["producer"]) >= 0]
        if len(prods) != 1:
            break
        e = prods[0]
    return t.string(t.events[e]["op"])
