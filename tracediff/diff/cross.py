"""Compare a run of one framework with a run of another (a Flax model and its PyTorch
port), in two traces or in one trace that recorded both.

The pairs come from `pairing.py` (dataflow, dtype and role; see its docstring); this
module turns them into the `Differ` the rest of `diff/` uses:

* values of two dtypes are compared by value: int32 tokens equal int64 tokens, optax's
  int32 `count` equals torch's float32 `step`; a pair whose values are equal is never a
  difference, at either level;
* b's arrays are laid out like a's before comparing (a reshape, a transpose, an axis
  permutation such as NCHW -> NHWC), choosing the layout under which they agree best;
* "introduced here" compares what the two units (or composites) read, input by input,
  matched through the pairing (same atom, or made by paired units);
* optimizer snapshots are compared by role (optroles.py) in the per-step table;
* a finding names the layer on both sides ("Dense MLP/fc1 (dot_general + add) <-> Linear
  fc1 (addmm)", `Finding.layer`).

One trace, two frameworks: `CrossDiffer(t, t)` compares the JAX events (a) with the
torch events (b) of the same file; event numbers stay those of the file.
"""

import json

import numpy as np

from ..errors import TraceError
from ..trace import schema
from ..trace.sources import split_site
from ..trace.values import parse_shape
from . import align as _align
from . import compare
from . import optroles
from . import pairing as _pairing
from .differ import BITWISE, Differ, comparable
from .result import OptimizerStep
from .pairing import op_family  # noqa: F401  (the op families, for callers and tests)

MAX_MAPPING = 200
SAMPLE = 2048          # elements compared to choose a layout
# pairs whose two sides are regions of different ops, compared as one unit
REGION_PAIRS = ("module output", "dataflow (values meet)", "dataflow (composite)")


def sides(ta, tb):
    """(framework of a, framework of b) for a cross-framework comparison; None when the
    traces are not one (a single framework on both sides)."""
    fa = set(np.unique(ta.events["framework"]).tolist()) - {0}
    fb = set(np.unique(tb.events["framework"]).tolist()) - {0}
    if ta is tb:   # one trace that recorded both (`locate T`); `locate T T` compares T with itself
        return (schema.FW_JAX, schema.FW_TORCH) if fa == {schema.FW_JAX, schema.FW_TORCH} else None
    if len(fa) == 1 and len(fb) == 1 and fa != fb:
        return next(iter(fa)), next(iter(fb))
    if len(fa) == 2 and len(fb) == 1:
        return next(iter(fa - fb)), next(iter(fb))
    if len(fa) == 1 and len(fb) == 2:
        return next(iter(fa)), next(iter(fb - fa))
    return None


def load_map(map_file):
    if map_file is None:
        return {}
    try:
        with open(map_file, encoding="utf-8") as fh:
            m = json.load(fh)
    except OSError as exc:
        raise TraceError(f"{map_file}: cannot read the map file ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{map_file}: the map file is not valid JSON ({exc})") from None
    if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in m.items()):
        raise TraceError(f"{map_file}: the map must be a JSON object of string to string")
    return m


class CrossAlignment(_align.Alignment):
    """An alignment of computing units (not of every event): `stats` counts units."""

    def __init__(self, a2b, b2a, units_a, units_b, paired_values):
        super().__init__(a2b, b2a, 0, 0)
        self.units_a, self.units_b, self.paired_values = units_a, units_b, paired_values

    def stats(self):
        matched = int((self.a2b >= 0).sum())
        return {"events_a": len(self.units_a), "events_b": len(self.units_b), "matched": matched,
                "only_in_a": len(self.units_a) - matched, "only_in_b": len(self.units_b) - matched,
                "anchors_matched": 0, "fallback_regions": 0, "counted": "computing units",
                "values_paired": self.paired_values}

    def gaps(self, limit=5):
        out = []
        for side, reps, arr in (("a", self.units_a, self.a2b), ("b", self.units_b, self.b2a)):
            run = None
            for e in reps:
                if arr[e] < 0:
                    if run is None:
                        run = {"side": side, "start": int(e), "length": 0}
                        out.append(run)
                    run["length"] += 1
                else:
                    run = None
            out = out[:limit * (1 if side == "a" else 2)]
        return out


class CrossDiffer(Differ):
    """A `Differ` whose pairs come from `pairing.py`, for two frameworks."""

    def __init__(self, ta, tb, rtol=None, atol=None, map_file=None, frameworks=None):
        fws = frameworks or sides(ta, tb)
        if fws is None:
            raise TraceError(f"{ta.path}: both sides hold the same single framework; "
                             f"nothing to compare across frameworks")
        self.fw_a, self.fw_b = fws
        self.one_trace = ta is tb
        strings = _align.StringIds()
        sa, sb = _align.prepare(ta, strings), _align.prepare(tb, strings)
        none = np.zeros(0, np.int64)
        super().__init__(ta, tb, rtol, atol, alignment=_align.Alignment(none, none, 0, 0),
                         sides=(sa, sb))
        if ta is tb:
            self.rb = self.ra      # one byte arena for both sides
        ga = _pairing.SideGraph(ta, sa, self.fw_a, "a", self.ra)
        gb = _pairing.SideGraph(tb, sb, self.fw_b, "b", self.rb)
        self.optim = self._optim_pairs(ta, tb, sa, sb)
        self._layout = {}
        self.p = _pairing.Pairing(ga, gb, load_map(map_file), self._role_rows(None),
                                  agree=self._values_meet)
        self.ga, self.gb = ga, gb
        a2b = np.full(len(ta), -1, np.int64)
        b2a = np.full(len(tb), -1, np.int64)
        for pr in self.p.pairs:
            ea, eb = ga.units[pr.a].rep, gb.units[pr.b].rep
            a2b[ea], b2a[eb] = eb, ea
        self.al = CrossAlignment(a2b, b2a, [u.rep for u in ga.units],
                                 [u.rep for u in gb.units], len(self.p.atom_rows))
        self.pair_by = {ga.units[pr.a].rep: pr.by for pr in self.p.pairs}
        self.pairs_list = sorted((ga.units[pr.a].rep, k) for k, pr in enumerate(self.p.pairs))
        self._sync_content()

    def _values_meet(self, row_a, row_b):
        """Two values the two sides reach by different ops agree within tolerance (where
        pairing.py may pair them: the values meet)."""
        m = self.compare_rows(row_a, row_b)
        return bool(m is not None and m.get("within_tolerance"))

    # -- the optimizer snapshots ------------------------------------------------------------
    def _optim_pairs(self, ta, tb, sa, sb):
        ea = np.flatnonzero((sa.kind == schema.KIND_OPTIM) & (ta.events["framework"] == self.fw_a))
        eb = np.flatnonzero((sb.kind == schema.KIND_OPTIM) & (tb.events["framework"] == self.fw_b))
        return list(zip(ea.tolist(), eb.tolist()))

    @staticmethod
    def _named(t, e):
        return {t.string(r["name"]): r for r in t.value_rows(e, schema.ROLE_OUT) if r["name"] >= 0}

    def _fw_name(self, fw):
        return schema.FW_NAMES.get(fw, "")

    def _roles(self, ea, eb, module_map):
        na, nb = self._named(self.ta, ea), self._named(self.tb, eb)
        sizes_a = {k: int(np.prod(parse_shape(self.ta.string(r["shape"])) or (1,))) for k, r in na.items()}
        sizes_b = {k: int(np.prod(parse_shape(self.tb.string(r["shape"])) or (1,))) for k, r in nb.items()}
        return na, nb, optroles.role_pairs(list(na), self._fw_name(self.fw_a), list(nb),
                                           self._fw_name(self.fw_b), sizes_a, sizes_b, module_map)

    def _role_rows(self, module_map):
        """Value rows of the same parameter after each optimizer step on both sides: optax
        snapshots the params before its step (the next snapshot holds them after), torch
        after."""
        ta, tb = self.ta, self.tb
        out = []
        for k, (ea, eb) in enumerate(self.optim):
            na, nb, pairs = self._roles(ea, eb, module_map)
            nxt = self.optim[k + 1] if k + 1 < len(self.optim) else None
            for role, xa, xb, _ in pairs:
                if role != "params" or nxt is None:
                    continue
                if isinstance(xa, tuple):
                    ra = self._named(ta, nxt[0]).get(xa[0])
                    rb = nb.get(xb)
                elif isinstance(xb, tuple):
                    ra = na.get(xa)
                    rb = self._named(tb, nxt[1]).get(xb[0])
                else:
                    ra, rb = na.get(xa), nb.get(xb)
                if ra is not None and rb is not None:
                    out.append((ra, rb))
        return out

    def _snapshot_value(self, t, reader, named, name):
        """A snapshot value by name; for optax (params, updates): params + updates, the
        parameters after the step (what optax.apply_updates computes)."""
        if isinstance(name, tuple):
            p, u = (named.get(n) for n in name)
            if p is None or u is None or not comparable(p) or not comparable(u):
                return None, None
            xp, xu = reader.read(p), reader.read(u)
            return np.asarray(xp + xu).astype(xp.dtype), t.string(p["dtype"])
        r = named.get(name)
        if r is None or not comparable(r):
            return None, None
        return reader.read(r), t.string(r["dtype"])

    def optimizer_steps(self):
        """Per optimizer step: the parameters, grads and optimizer state paired by role."""
        rows = []
        for ea, eb in self.optim:
            na, nb, pairs = self._roles(ea, eb, self.p.module_map)
            worst_rel, worst_abs, worst_name, bit, n = 0.0, 0.0, None, True, 0
            worst_l2 = worst_tabs = None
            l2 = compare.RelL2()
            for role, xa_name, xb_name, _ in pairs:
                xa, da = self._snapshot_value(self.ta, self.ra, na, xa_name)
                xb, db = self._snapshot_value(self.tb, self.rb, nb, xb_name)
                if xa is None or xb is None:
                    continue
                m = self.compare_values(xa, xb, da, db)
                n += 1
                bit &= m["bitwise_equal"]
                rel = _num(m.get("max_rel"))
                if role != "params":
                    continue
                xb_t = self.transform_b(None, None, np.asarray(xa), np.asarray(xb))
                l2.add(xa, xb_t)
                own = compare.RelL2()   # this tensor's ||a - b|| / ||a||: names the worst
                own.add(xa, xb_t)
                v = own.value() if not m["bitwise_equal"] else None
                worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, _num(m.get("max_abs")))
                if v is not None and (worst_name is None or v > worst_l2):
                    worst_l2, worst_tabs = v, _num(m.get("max_abs"))
                    worst_name = (f"{optroles.after_step_name(xa_name)} <-> "
                                  f"{optroles.after_step_name(xb_name)}")
            rows.append(OptimizerStep(step=int(self.ta.events["step"][ea]), a=ea, b=eb,
                                      bitwise_equal=bool(bit), max_rel=worst_rel,
                                      max_abs=worst_abs, worst=worst_name, compared=n,
                                      by="role", rel_l2=l2.value() if n else None,
                                      worst_rel_l2=worst_l2, worst_max_abs=worst_tabs))
        return rows

    # -- comparison ------------------------------------------------------------------------
    def _sync_content(self):
        """Make the content hashes of paired events agree exactly when their values do
        (chain.py and others use them as a fast "differs" test)."""
        sa, sb = self.sa, self.sb
        sb.content = sb.content.copy()
        for ea, k in self.pairs_list:
            eb = int(self.al.a2b[ea])
            equal = self.equal_at(ea, eb, BITWISE)
            if equal:
                sb.content[eb] = sa.content[ea]
            elif sb.content[eb] == sa.content[ea]:
                sb.content[eb] = sa.content[ea] ^ np.uint64(1)

    def transform_b(self, row_a, row_b, xa, xb):
        xa, xb = np.asarray(xa), np.asarray(xb)
        if xa.shape == xb.shape:
            return xb
        key = (int(row_a["offset"]), int(row_b["offset"])) if row_a is not None else None
        p = self._layout.get(key) if key else None
        if p is None:
            p = best_layout(xa, xb)
            if key:
                self._layout[key] = p
        return xb if p is None else _pairing.apply_perm(xb, xa.shape, p)

    def compare_rows(self, row_a, row_b, tol_dtype=None):
        if row_a is None or row_b is None:
            return None
        da, db = self.ta.string(row_a["dtype"]), self.tb.string(row_b["dtype"])
        if da == db:
            return super().compare_rows(row_a, row_b, tol_dtype)
        if not comparable(row_a) or not comparable(row_b):
            return None
        key = (int(row_a["offset"]), int(row_b["offset"]), int(row_a["nbytes"]), tol_dtype, "x")
        hit = self._cmp_val.get(key)
        if hit is None:
            hit = self._cmp_val[key] = self.compare_values(
                self.ra.read(row_a), self.rb.read(row_b), da, db, row_a, row_b, tol_dtype)
        return hit

    def compare_values(self, xa, xb, da, db, row_a=None, row_b=None, tol_dtype=None):
        """Metrics of two arrays, possibly of two dtypes, b laid out like a. Values of two
        dtypes are compared as numbers; equal numbers are equal at every level."""
        xa = np.asarray(xa)
        xb = self.transform_b(row_a, row_b, xa, np.asarray(xb))
        if da == db:
            m = compare.compare_arrays(xa, xb, da, self.rtol, self.atol, tol_dtype=tol_dtype,
                                       ulp=self.ulp)
            m["bitwise_equal"] = bool(xa.shape == np.asarray(xb).shape and
                                      xa.tobytes() == np.ascontiguousarray(xb).tobytes())
            if m["bitwise_equal"]:
                m["within_tolerance"] = True
            return m
        fa, fb = _as_f64(xa), _as_f64(xb)
        floats = compare.is_floating(da) and compare.is_floating(db)
        if fa is None or fb is None or fa.shape != fb.shape:
            m = compare.compare_arrays(xa, xb, da)
            m.update(bitwise_equal=False, within_tolerance=False, dtype_mismatch=[da, db])
            return m
        if floats:
            weak = min((da, db), key=lambda n: -compare.tolerance(n)[0])
            m = compare.compare_arrays(fa.astype(weak) if weak != "float64" else fa,
                                       fb.astype(weak) if weak != "float64" else fb, weak,
                                       self.rtol, self.atol, ulp=self.ulp)
        else:   # integers, or an integer against a float (a counter): exact, by value
            m = compare.compare_arrays(fa, fb, "float64", 0.0, 0.0)
        equal = bool(np.array_equal(fa, fb, equal_nan=fa.dtype.kind == "f"))
        m["dtype_mismatch"] = [da, db]
        m["bitwise_equal"] = equal
        m["equal_values"] = equal
        if equal:
            m["within_tolerance"] = True
        elif not floats:
            m["within_tolerance"] = False
        return m

    # -- inputs ----------------------------------------------------------------------------
    def _label(self, t, side, row):
        """'<input> [8, 12] (event 147)': a value and the op it was moved from."""
        if row is None:
            return "?"
        e = int(row["event"])
        src, hops = e, 0
        while hops < 6 and side.kind[src] not in (schema.KIND_INPUT,) and \
                op_family(t.string(t.events[src]["op"])) is None:
            prods = [int(r["producer"]) for r in t.input_rows(src) if int(r["producer"]) >= 0]
            if len(prods) != 1:
                break
            src, hops = prods[0], hops + 1
        shape = t.string(row["shape"])
        text = f"{t.string(t.events[src]['op'])} [{shape}] (event {src}"
        return text + (f" via {t.string(t.events[e]['op'])} {e})" if src != e else ")")

    def inputs_match(self, ea, eb, level):
        ka, kb = int(self.ga.unit_of[ea]), int(self.gb.unit_of[eb])
        if ka < 0 or kb < 0:
            return super().inputs_match(ea, eb, level)
        ins_a = _dedupe(self.p.region_inputs(0, ka))
        ins_b = _dedupe(self.p.region_inputs(1, kb))
        used = set()
        bad, unknown, matched, own = [], [], [], []
        region = self.p.pairs[self.p.pair_of[0][ka]].by in REGION_PAIRS \
            if ka in self.p.pair_of[0] else False
        keys_b = {x[3] for x in ins_b if x[3] is not None}
        for _, _, row, key in ins_a:
            j = None
            if region and key is not None and key[0] == "atom" and key not in keys_b:
                # a module's own computation that reads a parameter or constant the other
                # side's does not (Flax's head mask of ones): nothing to differ, and a
                # difference it makes is introduced inside this module
                own.append(self._label(self.ta, self.sa, row))
                continue
            if key is not None:
                j = next((i for i, x in enumerate(ins_b) if i not in used and x[3] == key), None)
            if j is None and row is not None:   # same bytes, then same size
                j = next((i for i, x in enumerate(ins_b) if i not in used and x[2] is not None
                          and x[3] is None and int(x[2]["hash"]) == int(row["hash"])), None)
                if j is None:
                    j = next((i for i, x in enumerate(ins_b) if i not in used and x[2] is not None
                              and x[3] is None and int(x[2]["nbytes"]) == int(row["nbytes"])), None)
            label = self._label(self.ta, self.sa, row)
            if j is None and region:
                own.append(label)
                continue
            if j is None:
                unknown.append(f"{label}: no counterpart among the inputs of b")
                continue
            used.add(j)
            rb = ins_b[j][2]
            m = self.compare_rows(row, rb) if row is not None and rb is not None else None
            if m is None:
                unknown.append(f"{label}: not stored")
                continue
            shape_a = parse_shape(self.ta.string(row["shape"]))
            shape_b = parse_shape(self.tb.string(rb["shape"]))
            how = ""
            if m.get("dtype_mismatch"):
                how = f" ({m['dtype_mismatch'][0]} vs {m['dtype_mismatch'][1]})"
            elif shape_a != shape_b:
                how = " (transposed)" if tuple(shape_a) == tuple(reversed(shape_b)) and \
                    len(shape_a) == 2 else " (reshaped)" if len(shape_a) != len(shape_b) or \
                    sorted(shape_a) != sorted(shape_b) else " (axes permuted)"
            ok = m["bitwise_equal"] if level == BITWISE else m["within_tolerance"]
            entry = {"input": label, "b": self._label(self.tb, self.sb, rb) + how, "metrics": m,
                     "paired": "by value" if key and key[0] == "atom" else
                     "through the dataflow" if key else "by size"}
            (matched if ok else bad).append(entry)
        if bad:
            return False, f"{len(bad)} of its inputs differ: " + ", ".join(
                f"{d['input']} vs b {d['b']}" for d in bad[:3]), bad
        if unknown:
            return None, "; ".join(unknown[:3]), []
        word = "bitwise" if level == BITWISE else "within tolerance"
        extra = f"; a's module also reads {', '.join(own[:3])}, which b's does not" if own else ""
        return True, (f"all {len(matched)} inputs and parameters match ({word}): " +
                      ", ".join(f"{d['input']} = b {d['b']}" for d in matched[:4]) + extra), []

    # -- search ----------------------------------------------------------------------------
    def search(self, level):
        for i, (ea, k) in enumerate(self.pairs_list):
            pr = self.p.pairs[k]
            eb = self.gb.units[pr.b].rep
            if self.equal_at(ea, eb, level):
                continue
            f = self.finding(ea, eb, level, note=self._note(pr))
            f.layer = self.layer(pr)
            mod = self.module_output(i)
            if mod is not None:
                f.layer["module"] = mod
                f.note += (f"; the output of module {mod['a'] or '(top level)'} <-> "
                           f"{mod['b'] or '(top level)'} (a event {mod['a_event']}, b event "
                           f"{mod['b_event']}): max abs {_num(mod['max_abs']):.3g}")
            ins = self.inside(pr, level)
            if ins is not None:
                f.layer["inside"] = ins
                f.note += (f"; inside, the first op of a that meets none of b: a {ins['a_op']} "
                           f"(event {ins['a']}), closest to b {ins['b_op']} (event {ins['b']}), max abs "
                           f"{_num(ins['max_abs']):.3g}")
            return f, None
        return None, None

    def _note(self, pr):
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        return (f"a: {ua.label} (events {', '.join(map(str, ua.events))}) paired with "
                f"b: {ub.label} (events {', '.join(map(str, ub.events))}) by {pr.by}, "
                f"op family {ua.family}: {pr.how}")

    def module_output(self, i):
        """The module a finding's pair (the i-th of `pairs_list`) lies in, and its output:
        the last pair after it, in a's order, whose units are still inside that module on
        both sides. {'a', 'b' (module paths), 'a_event', 'b_event', 'max_abs', 'max_rel'}."""
        pr = self.p.pairs[self.pairs_list[i][1]]
        ma, mb = pr.modules or (self.p.unit_module(0, pr.a), self.p.unit_module(1, pr.b))

        def within(m, top):
            return not top or m == top or m.startswith(top + "/")

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
        fam = next((f for f in (ua.family, ub.family) if f in _pairing.LAYER_KIND), ua.family)
        a = _pairing.layer_text(ua, self.fw_a, fam, self._region_label(0, pr.a), pr.modules and
                                pr.modules[0])
        b = _pairing.layer_text(ub, self.fw_b, fam, self._region_label(1, pr.b), pr.modules and
                                pr.modules[1])
        ma, mb = pr.modules or (ua.module, ub.module)
        return {"a": a, "b": b, "text": f"{a} <-> {b}", "family": fam,
                "a_module": ma, "b_module": mb,
                "a_source": split_site(self.ta.string(self.ta.events[ua.rep]["source"]))[0],
                "b_source": split_site(self.tb.string(self.tb.events[ub.rep]["source"]))[0]}

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
                        "phase": "backward" if ua.phase == _pairing.PHASE_BWD else "forward",
                        "a_name_stack": ta.string(ta.events[ea]["name_stack"]),
                        "b_name_stack": tb.string(tb.events[ub.rep]["name_stack"]),
                        "a_module": ua.module, "b_module": ub.module, "layer": lay["text"]})
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


def _dedupe(ins):
    seen, out = set(), []
    for x in ins:
        row = x[2]
        k = (int(row["event"]), int(row["slot"]), int(row["role"])) if row is not None else id(x)
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def _as_f64(x):
    x = np.asarray(x)
    try:
        return x.astype(np.float64) if x.dtype.kind in "fiub" else None
    except (TypeError, ValueError):
        return None


def _finite(x):
    """A metric for the JSON-bound `layer` dict: a finite float, or None."""
    return float(x) if x is not None and np.isfinite(x) else None


def _num(x):
    """A metric as a float for ranking (metrics are floats; None, when not computed, is 0)."""
    return 0.0 if x is None else float(x)


def best_layout(xa, xb):
    """The axis order under which b's array agrees best with a's (see
    `pairing.permutations_to`), judged on a sample of elements; None if none fits."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    perms = _pairing.permutations_to(xa.shape, xb.shape)
    if not perms:
        return None
    if len(perms) == 1:
        return perms[0]
    n = xa.size
    rng = np.random.default_rng(0)
    idx = rng.choice(n, SAMPLE, replace=False) if n > SAMPLE else np.arange(n)
    coords = np.unravel_index(idx, xa.shape)
    fa = _as_f64(xa.reshape(-1)[idx])
    fb_all = xb.reshape(-1)
    best, best_score = None, -1.0
    for p in perms:
        shape_t = [xa.shape[i] for i in p]
        flat = np.ravel_multi_index([coords[i] for i in p], shape_t)
        fb = _as_f64(fb_all[flat])
        if fa is None or fb is None:
            return perms[0]
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.isclose(fa, fb, rtol=1e-2, atol=1e-6, equal_nan=True)
        score = float(close.mean()) if len(close) else 1.0
        if score > best_score:
            best, best_score = p, score
        if score == 1.0:
            break
    return best


def cross_differ(ta, tb, rtol=None, atol=None, map_file=None):
    """(CrossDiffer, mapping list) for two traces of different frameworks, or one trace
    (passed twice) that recorded both."""
    d = CrossDiffer(ta, tb, rtol, atol, map_file)
    return d, d.mapping()
