"""What a cross-framework finding says about where it is: the layer on both sides, the
module it lies in and that module's output, the first op inside a region that meets none
of the other side's, the module-name conventions and crossings (`align/modnames.py`), and
the whole mapping of pairs (`--show-mapping`).
"""

import numpy as np

from ...trace.sources import split_site
from ..align import modnames
from ..align import optroles
from . import graph as _graph

MAX_MAPPING = 200
# pairs whose two sides are regions of different ops, compared as one unit
REGION_PAIRS = ("module output", "dataflow (values meet)", "dataflow (composite)")


class LayerNames:
    """Layers, modules and the mapping of a `CrossDiffer`'s pairs (see the module docstring)."""

    def _note(self, pr):
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        cross_text = self.names(pr)["names_cross"]
        ns = lambda t, e: t.string(t.events[e]["name_stack"])  # noqa: E731
        upstream = self._crossed_upstream(pr)
        return ((f"names cross: {cross_text} (a {ns(self.ta, ua.rep)}, b "
                 f"{ns(self.tb, ub.rep)}); " if cross_text else "") +
                (f"upstream values pair across names: {', '.join(upstream[:4])}; " if upstream
                 else "") +
                f"a: {ua.label} (events {', '.join(map(str, ua.events))}) paired with "
                f"b: {ub.label} (events {', '.join(map(str, ub.events))}) by {pr.by}, "
                f"op family {ua.family}: {pr.how}")

    def module_output(self, i):
        """The module a finding's pair (the i-th of `pairs_list`) lies in, and its output:
        the last pair after it, in a's order, whose units are still inside that module on
        both sides. {'a', 'b' (module paths), 'a_event', 'b_event', 'max_abs', 'max_rel'}."""
        pr = self.p.pairs[self.pairs_list[i][1]]
        ma, mb = pr.modules or (self.p.unit_module(0, pr.a), self.p.unit_module(1, pr.b))
        last = pr
        for _, k in self.pairs_list[i + 1:]:
            q = self.p.pairs[k]
            if not within(self.p.unit_module(0, q.a), ma):
                break
            if within(self.p.unit_module(1, q.b), mb):
                last = q
        ea, eb = self.ga.units[last.a].rep, self.gb.units[last.b].rep
        m = self.compare_event(ea, eb)["metrics"]
        return {"a": ma, "b": mb, "a_event": int(ea), "b_event": int(eb),
                "max_abs": _finite(m.get("max_abs")), "max_rel": _finite(m.get("max_rel"))}

    def inside(self, pr, level):
        """In a region compared as one unit (values meet, composite, module output): the
        first op of a's region, in order, of a family b's region has too, that agrees with
        no op of the same size in b's region, and the op of b's it comes closest to (the
        same family first on a tie; torch eager's scaled scores are a `div`, not the `bmm`):
        {'a', 'b' (events), 'a_op', 'b_op', 'max_abs', 'max_rel'}; None when every op of a
        meets one of b or b has none of its size (fused against unfused attention)."""
        if pr.by not in REGION_PAIRS:
            return None
        ga, gb = self.ga, self.gb
        rb = self.p.region(1, pr.b)
        families_b = {gb.units[kb].family for kb in rb}
        for k in self.p.region(0, pr.a):
            ua = ga.units[k]
            if ua.family not in families_b:
                continue          # no comparable op on b's side (a composite's equations)
            best = None
            for kb in rb:
                ub = gb.units[kb]
                if ub.size != ua.size or ub.dtype != ua.dtype:
                    continue
                ea, eb = ua.rep, ub.rep
                if self.equal_at(ea, eb, level):
                    best = None
                    break
                m = self.compare_event(ea, eb)["metrics"]
                rank = (_num(m.get("max_abs")), ub.family != ua.family)
                if best is None or rank < best[0]:
                    best = (rank, kb, m)
            else:
                if best is None:
                    continue
                _, kb, m = best
                return {"a": int(ua.rep), "b": int(gb.units[kb].rep), "a_op": ua.label,
                        "b_op": gb.units[kb].label, "max_abs": _finite(m.get("max_abs")),
                        "max_rel": _finite(m.get("max_rel"))}
        return None

    def layer(self, pr):
        """The layer a pair computes, named on both sides, with module paths and sources."""
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        fam = next((f for f in (ua.family, ub.family) if f in _graph.LAYER_KIND), ua.family)
        a = _graph.layer_text(ua, self.fw_a, fam, self._region_label(0, pr.a), pr.modules and
                                pr.modules[0])
        b = _graph.layer_text(ub, self.fw_b, fam, self._region_label(1, pr.b), pr.modules and
                                pr.modules[1])
        ma, mb = pr.modules or (ua.module, ub.module)
        names = self.names(pr)
        cross_text = f"; names cross: {names['names_cross']}" if names["names_cross"] else ""
        return {"a": a, "b": b, "text": f"{a} <-> {b}{cross_text}", "family": fam,
                "a_module": ma, "b_module": mb, **names,
                "a_source": split_site(self.ta.string(self.ta.events[ua.rep]["source"]))[0],
                "b_source": split_site(self.tb.string(self.tb.events[ub.rep]["source"]))[0]}

    def _crossed_upstream(self, pr, hops=4, limit=64):
        """names_cross of the pairs that made what this pair reads, a few paired hops back
        (a q/k swap two ops before the softmax where the values first differ)."""
        out, seen, frontier = [], set(), [pr]
        for _ in range(hops):
            nxt = []
            for q in frontier:
                for _, _, _, key in self.p.region_inputs(0, q.a):
                    if not key or key[0] != "pair" or key[1] in seen or len(seen) >= limit:
                        continue
                    seen.add(key[1])
                    up = self.p.pairs[key[1]]
                    text = self.names(up)["names_cross"]
                    if text:
                        if text not in out:
                            out.append(text)
                    else:
                        nxt.append(up)
            frontier = nxt
        return out

    def names(self, pr):
        """How the module paths of a pair correspond (align/modnames.py): `module_rule` (the
        conventions that map one name to the other: 'same name', 'root FlaxBertModule
        dropped; layers_0 = layers.0'; None when they do not), `names_cross` ('values of
        query pair with key's' when the values pair across different names, else None)."""
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        ma, mb = pr.modules or (ua.module, ub.module)
        ok, rules = modnames.match(ma, mb)
        rule = ("; ".join(rules) or "same name") if ok else None
        return {"module_rule": rule, "names_cross": modnames.crossing(ma, mb)}

    def _region_label(self, s, k, limit=6):
        """The ops of a unit and of the composite it ends: 'sub + mul + rsqrt + add'."""
        g = self.ga if s == 0 else self.gb
        region = self.p.region(s, k)
        labels = [g.units[v].label for v in region]
        if len(labels) > limit:
            labels = labels[:2] + [f"{len(labels) - 3} more"] + labels[-1:]
        return " + ".join(labels)

    def mapping(self, limit=MAX_MAPPING):
        """Every pair and how it was made: the units, the values paired by value (inputs
        and parameters read by paired units), the optimizer state by role."""
        out = []
        ta, tb = self.ta, self.tb
        used_atoms = set()
        for ea, k in self.pairs_list:
            pr = self.p.pairs[k]
            ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
            lay = self.layer(pr)
            out.append({"a": ea, "b": ub.rep, "by": pr.by, "how": pr.how,
                        "a_op": self._region_label(0, pr.a), "b_op": self._region_label(1, pr.b),
                        "family": lay["family"],
                        "phase": "backward" if ua.phase == _graph.PHASE_BWD else "forward",
                        "a_name_stack": ta.string(ta.events[ea]["name_stack"]),
                        "b_name_stack": tb.string(tb.events[ub.rep]["name_stack"]),
                        "a_module": ua.module, "b_module": ub.module, "layer": lay["text"],
                        "module_rule": lay["module_rule"], "names_cross": lay["names_cross"]})
            for _, _, _, key in self.p.region_inputs(0, pr.a):
                if key and key[0] == "atom":
                    used_atoms.add(key[1])
        for aid in sorted(used_atoms):
            ra, rb, how = self.p.atom_rows[aid]
            ea, eb = int(ra["event"]), int(rb["event"])
            out.append({"a": ea, "b": eb, "by": "value", "how": how,
                        "a_op": f"{ta.string(ta.events[ea]['op'])} [{ta.string(ra['shape'])}]",
                        "b_op": f"{tb.string(tb.events[eb]['op'])} [{tb.string(rb['shape'])}]",
                        "family": "input", "phase": "forward",
                        "a_name_stack": ta.string(ta.events[ea]["name_stack"]),
                        "b_name_stack": tb.string(tb.events[eb]["name_stack"]),
                        "a_module": "", "b_module": "", "layer": ""})
        if self.optim:
            ea, eb = self.optim[0]
            for role, xa, xb, how in self._roles(ea, eb, self.p.module_map)[2]:
                out.append({"a": ea, "b": eb, "by": "role", "how": f"{role}, parameter {how}",
                            "a_op": optroles.after_step_name(xa),
                            "b_op": optroles.after_step_name(xb), "family": "optimizer",
                            "phase": "optimizer", "a_name_stack": "", "b_name_stack": "",
                            "a_module": "", "b_module": "", "layer": ""})
        return out[:limit]


def within(module, top):
    """`module` is `top` or lies inside it (the top level holds everything)."""
    return not top or module == top or module.startswith(top + "/")


def _finite(x):
    """A metric for the JSON-bound `layer` dict: a finite float, or None."""
    return float(x) if x is not None and np.isfinite(x) else None


def _num(x):
    """A metric as a float for ranking (metrics are floats; None, when not computed, is 0)."""
    return 0.0 if x is None else float(x)
