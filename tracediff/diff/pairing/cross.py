"""Compare a run of one framework with a run of another (a Flax model and its PyTorch
port), in two traces or in one trace that recorded both.

The pairs come from `pairing/dataflow.py` (dataflow, dtype and role; see its docstring); this
module turns them into the `Differ` the rest of `diff/` uses:

* values of two dtypes are compared by value: int32 tokens equal int64 tokens, optax's
  int32 `count` equals torch's float32 `step`; a pair whose values are equal is never a
  difference, at either level;
* b's arrays are laid out like a's before comparing (a reshape, a transpose, an axis
  permutation such as NCHW -> NHWC), choosing the layout under which they agree best
  (`layout.py`);
* "introduced here" compares what the two units (or composites) read, input by input,
  matched through the pairing (same atom, or made by paired units);
* optimizer snapshots are compared by role (align/optroles.py) in the per-step table
  (`roles.py`);
* a finding names the layer on both sides ("Dense MLP/fc1 (dot_general + add) <-> Linear
  fc1 (addmm)", `Finding.layer`; `layers.py`).

One trace, two frameworks: `CrossDiffer(t, t)` compares the JAX events (a) with the
torch events (b) of the same file; event numbers stay those of the file. The user's module
map (`--map`) is read by `mapfile.py`.
"""

import numpy as np

from ...errors import TraceError
from ...trace import schema
from ...trace.values import parse_shape
from ..align import sequence as _align
from ..compare import values as compare
from . import dataflow as _pairing
from . import graph as _graph
from ..differ import BITWISE, Differ, comparable
from .graph import op_family  # noqa: F401  (the op families, for callers and tests)
from .layers import LayerNames, _num
from .layout import _as_f64, best_layout
from .mapfile import load_map
from .meet import FormulaMeeting
from .roles import RoleSteps
from .rounding import RoundingInherited
from .regions import INDEX_ROLE
from .shapes import OTHER_SHAPE, OtherShapes
from .stops import PairingStops


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


class CrossDiffer(LayerNames, FormulaMeeting, RoundingInherited, RoleSteps, OtherShapes,
                  PairingStops, Differ):
    """A `Differ` whose pairs come from `pairing/dataflow.py`, for two frameworks; the
    optimizer steps by role are in `roles.py`, the layer names and the mapping in `layers.py`."""

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
        ga = _graph.SideGraph(ta, sa, self.fw_a, "a", self.ra)
        gb = _graph.SideGraph(tb, sb, self.fw_b, "b", self.rb)
        self.optim = self._optim_pairs(ta, tb, sa, sb)
        self._layout = {}
        self.ga, self.gb = ga, gb
        self.p = _pairing.Pairing(ga, gb, load_map(map_file), self._role_rows(None),
                                  agree=self._values_meet)
        a2b = np.full(len(ta), -1, np.int64)
        b2a = np.full(len(tb), -1, np.int64)
        for pr in self.p.pairs:
            ea, eb = ga.units[pr.a].rep, gb.units[pr.b].rep
            a2b[ea], b2a[eb] = eb, ea
        self.al = CrossAlignment(a2b, b2a, [u.rep for u in ga.units],
                                 [u.rep for u in gb.units], len(self.p.atom_rows))
        self.pair_by = {ga.units[pr.a].rep: pr.by for pr in self.p.pairs}
        self.pairs_list = sorted((ga.units[pr.a].rep, k) for k, pr in enumerate(self.p.pairs))
        self._spans = {}         # event of a -> the pairs a moved finding computed (meet.py)
        self._sync_content()

    def _values_meet(self, row_a, row_b):
        """Two values the two sides reach by different ops agree within tolerance, element
        by element or as a whole (where pairing/dataflow.py may pair them: the values meet).
        As a whole: after an optimizer step the rounding carried through a layer exceeds
        atol in a few elements (HF CLIP's residual add of step 1, 2.4e-6), and the LayerNorm
        equations after it were paired with it instead (max abs 0.114); whether the pair
        differs is judged apart (`search`)."""
        m = self.compare_rows(row_a, row_b)
        if m is None:
            return False
        if m.get("within_tolerance"):
            return True
        nw = self._normwise(row_a, row_b)
        return bool(nw is not None and nw[1])

    # -- comparison ------------------------------------------------------------------------
    def _sync_content(self):
        """Make the content hashes of paired events agree exactly when their values do
        (explain/chain.py and others use them as a fast "differs" test)."""
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
        if xa.size != xb.size and _graph.broadcast_shapes_of(xa.shape, xb.shape):
            return xb       # one is the other's broadcast: compared as numpy broadcasts them
        key = (int(row_a["offset"]), int(row_b["offset"])) if row_a is not None else None
        p = self._layout.get(key) if key else None
        if p is None:
            p = None if xa.shape == xb.shape and not _fused(self.ga, self.gb, row_a, row_b) else \
                best_layout(xa, xb, same_shape_exact=xa.shape == xb.shape)
            if key:
                self._layout[key] = p
        return _mask_extremes(xa, xb if p is None else _graph.apply_perm(xb, xa.shape, p))

    def _out_pairs(self, ea, eb):
        """Outputs of two paired units by slot; where one side computes several values in
        one op and the other one (torch's fused attention backward: the grads of q, k and v,
        against a JAX `dot_general`), the one output against the value of the other side
        that meets it (the smallest relative L2 among those of its size)."""
        ra = self.ta.value_rows(ea, schema.ROLE_OUT)
        rb = self.tb.value_rows(eb, schema.ROLE_OUT)
        if self.sa.kind[ea] == schema.KIND_OPTIM or len(ra) == len(rb) or \
                min(len(ra), len(rb)) != 1:
            return super()._out_pairs(ea, eb)
        one, many, a_is_one = (ra[0], rb, True) if len(ra) == 1 else (rb[0], ra, False)
        best, best_rel = None, None
        for r in many:
            if int(r["nbytes"]) != int(one["nbytes"]):
                continue
            nw = self._normwise(one, r) if a_is_one else self._normwise(r, one)
            if nw is not None and nw[0] is not None and (best_rel is None or nw[0] < best_rel):
                best, best_rel = r, nw[0]
        if best is None:
            return super()._out_pairs(ea, eb)
        return [(int(one["slot"]), one, best)] if a_is_one else [(int(best["slot"]), best, one)]

    def compare_rows(self, row_a, row_b, tol_dtype=None):
        if row_a is None or row_b is None:
            return None
        da, db = self.ta.string(row_a["dtype"]), self.tb.string(row_b["dtype"])
        if da == db and not _broadcast_rows(self.ta, self.tb, row_a, row_b):
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
        xa, xb = np.asarray(xa), np.asarray(xb)
        shapes = _graph.broadcast_shapes_of(xa.shape, xb.shape) if xa.shape != xb.shape else None
        if shapes is not None:       # one is the other's broadcast (or reshape): as numpy does
            xa, xb = np.broadcast_arrays(xa.reshape(shapes[0]), xb.reshape(shapes[1]))
        xb = self.transform_b(row_a, row_b, xa, xb)
        if da == db:
            m = compare.compare_arrays(xa, xb, da, self.rtol, self.atol, tol_dtype=tol_dtype,
                                       ulp=self.ulp)
            m["bitwise_equal"] = bool(xa.shape == np.asarray(xb).shape and
                                      np.ascontiguousarray(xa).tobytes() ==
                                      np.ascontiguousarray(xb).tobytes())
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

    def _unit_input_pairs(self, ka, kb, region=False):
        """[(row a, row b or None, key, own)]: what units ka and kb (and their composites)
        read from outside, matched: the same atom or made by paired units, else the same
        bytes, else the same size. In a `region` pair (two different op sequences compared
        as one unit) an input of a with no counterpart in b is the module's own (`own`
        True: Flax's head mask of ones, a parameter or constant b's computation does not
        read): nothing to differ, and a difference it makes is introduced inside."""
        ins_a = _dedupe(self.p.region_inputs(0, ka))
        ins_b = _dedupe(self.p.region_inputs(1, kb))
        keys_b = {x[3] for x in ins_b if x[3] is not None}
        used, out = set(), []
        for _, _, row, key in ins_a:
            if region and key is not None and key[0] == "atom" and key not in keys_b:
                out.append((row, None, key, True))
                continue
            j = None
            if key is not None:
                j = next((i for i, x in enumerate(ins_b) if i not in used and x[3] == key), None)
            if j is None and row is not None:   # same bytes, then same size
                j = next((i for i, x in enumerate(ins_b) if i not in used and x[2] is not None
                          and x[3] is None and int(x[2]["hash"]) == int(row["hash"])), None)
                if j is None:
                    j = next((i for i, x in enumerate(ins_b) if i not in used and x[2] is not None
                              and x[3] is None and int(x[2]["nbytes"]) == int(row["nbytes"])), None)
            if j is not None:
                used.add(j)
            out.append((row, None if j is None else ins_b[j][2], key, j is None and region))
        return out

    def judges_inputs_bitwise(self, ea, eb):
        return False   # two frameworks: inputs within tolerance are what "match" can mean

    def inputs_match(self, ea, eb, level):
        ka, kb = int(self.ga.unit_of[ea]), int(self.gb.unit_of[eb])
        if ka < 0 or kb < 0:
            return super().inputs_match(ea, eb, level)
        bad, unknown, matched, own = [], [], [], []
        for row, rb, key, is_own in self.input_entries(ea, ka, kb):
            label = self._label(self.ta, self.sa, row)
            if is_own:
                own.append(label)
                continue
            if rb is None:
                unknown.append(f"{label}: no counterpart among the inputs of b")
                continue
            m = self.compare_rows(row, rb) if row is not None and rb is not None else None
            if m is None:
                unknown.append(f"{label}: not stored")
                continue
            shape_a = parse_shape(self.ta.string(row["shape"]))
            shape_b = parse_shape(self.tb.string(rb["shape"]))
            how = ""
            ok = m["bitwise_equal"] if level == BITWISE else m["within_tolerance"]
            if m.get("dtype_mismatch"):
                how = f" ({m['dtype_mismatch'][0]} vs {m['dtype_mismatch'][1]})"
            elif shape_a != shape_b:
                how = " (transposed)" if tuple(shape_a) == tuple(reversed(shape_b)) and \
                    len(shape_a) == 2 else " (reshaped)" if len(shape_a) != len(shape_b) or \
                    sorted(shape_a) != sorted(shape_b) else " (axes permuted)"
                perm = self._layout.get((int(row["offset"]), int(rb["offset"])))
                if how == " (axes permuted)" and key and key[0] == "atom" and \
                        perm is not None and not _graph.conventional(perm):
                    # equal only in an axis order no framework uses for one tensor: the
                    # port converted it wrongly (a conv kernel with H and W swapped)
                    how = (f" (equal only with axes permuted {tuple(perm)}, not a layout "
                           f"either framework uses: converted wrongly?)")
                    ok = False
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
        self.rounding_inherited = []
        done = -1             # a span judged where its formulas meet: its pairs are judged
        tainted = set()       # pairs that read only what undetermined parameters shifted
        for i, (ea, k) in enumerate(self.pairs_list):
            if i <= done:
                continue
            pr = self.p.pairs[k]
            eb = self.gb.units[pr.b].rep
            if self.equal_at(ea, eb, level):
                continue
            # what an undetermined parameter shifted first: a pair reading it that also meets
            # the rounding rule still carries the shift to what reads it (HF ResNet trained
            # with BatchNorm in training mode: its backward, step 1)
            if level != BITWISE and self._undetermined_inherited(pr, tainted):
                tainted.add(k)
                continue
            if level != BITWISE and self._rounding_inherited(pr):
                self.rounding_inherited.append((ea, eb))
                continue
            i, pr, found, moved = self.move_to_meeting(i, level)   # two formulas (meet.py)
            if pr is None:
                continue         # other formulas inside, the same values where they meet
            if moved and level != BITWISE and self._rounding_inherited(pr):
                self.rounding_inherited.append((self.ga.units[pr.a].rep,
                                                self.gb.units[pr.b].rep))
                done = i
                continue         # where they meet, only the rounding of the span's inputs
            ea, eb = self.ga.units[pr.a].rep, self.gb.units[pr.b].rep
            f = self.finding(ea, eb, level, note=moved + self._note(pr))
            f.layer = self.layer(pr)
            if pr.by == OTHER_SHAPE:     # the same inputs, another shape (shapes.py)
                return self.other_shape(f, i), None
            if pr.by == INDEX_ROLE:      # a lookup of one table at other indices (shapes.py)
                self.indices_differ(f, pr)
            mod = self.module_output(i)
            if self._gradient_meets(pr, mod, level):
                continue         # other backward formulas inside, the same module gradient
            out = self._formulas_differ(f, pr, mod, level)
            if out is not None:
                return out, None
            if mod is not None:
                f.layer["module"] = mod
                f.note += (f"; the output of module {mod['a'] or '(top level)'} <-> "
                           f"{mod['b'] or '(top level)'} (a event {mod['a_event']}, b event "
                           f"{mod['b_event']}): max abs {_num(mod['max_abs']):.3g}")
            ins = self.inside(found, level)
            if ins is not None:
                f.layer["inside"] = ins
                f.note += (f"; inside, the first op of a that meets none of b: a {ins['a_op']} "
                           f"(event {ins['a']}), closest to b {ins['b_op']} (event {ins['b']}), max abs "
                           f"{_num(ins['max_abs']):.3g}")
            return f, None
        return None, None


def _mask_extremes(xa, xb):
    """b with -inf where a holds the dtype's lowest finite value and b -inf, or the reverse,
    made a's: an additive attention mask masks alike with either (Flax's `finfo.min` against
    torch's `-inf`), so such elements are equal values, never a difference."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.dtype.kind != "f" or xb.dtype != xa.dtype or xa.shape != xb.shape:
        return xb
    if not (np.isneginf(xa).any() or np.isneginf(xb).any()):
        return xb           # every comparison passes here: the usual case costs two scans
    low = np.finfo(xa.dtype).min
    swap = ((xa == low) & (xb == -np.inf)) | ((xa == -np.inf) & (xb == low))
    if swap.any():
        xb = np.where(swap, xa, xb)
    return xb


def _fused(ga, gb, row_a, row_b):
    """Is one of two values the output of a fused op of no family the other side has (torch's
    SDPA against a composite, whose intermediate layouts need not agree)? Ops of known
    families keep one layout: a transposed result there is a difference (q and k swapped,
    scores transposed), never a layout."""
    fams = []
    for g, r in ((ga, row_a), (gb, row_b)):
        k = int(g.unit_of[int(r["event"])]) if r is not None else -1
        fams.append(g.units[k].family if k >= 0 else None)
    return None not in fams and fams[0] != fams[1] and \
        any(f not in _graph.KNOWN_FAMILIES for f in fams)


def _broadcast_rows(ta, tb, row_a, row_b):
    """Is one value the other's broadcast, or the same array with dimensions of size 1
    dropped or added (`graph.broadcast_shapes_of`), in another shape?"""
    try:
        sa = tuple(parse_shape(ta.string(row_a["shape"])))
        sb = tuple(parse_shape(tb.string(row_b["shape"])))
    except ValueError:
        return False
    return sa != sb and _graph.broadcast_shapes_of(sa, sb) is not None


def _dedupe(ins):
    seen, out = set(), []
    for x in ins:
        row = x[2]
        k = (int(row["event"]), int(row["slot"]), int(row["role"])) if row is not None else id(x)
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def cross_differ(ta, tb, rtol=None, atol=None, map_file=None):
    """(CrossDiffer, mapping list) for two traces of different frameworks, or one trace
    (passed twice) that recorded both."""
    d = CrossDiffer(ta, tb, rtol, atol, map_file)
    return d, d.mapping()
