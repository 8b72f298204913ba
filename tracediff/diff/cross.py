"""Pair the events of two traces of different frameworks (a Flax run and a PyTorch run of
the same model) and locate where they part.

Pairing, in order of precedence; every pair records how it was made (`by`):

* `user map`: `--map FILE`, a JSON object {"a pattern": "b pattern"}. A pattern is a
  glob matched against an event's name stack, its op, or "name_stack:op"; the k-th unit
  of a that matches is paired with the k-th unit of b that matches.
* `value`: external inputs and parameters (input snapshots) are paired by their bytes:
  equal hash, or equal to the transpose of a 2-D value of b (a Flax kernel is the
  transpose of a torch Linear weight). Leftover inputs are paired in order by element
  count (`structure`), so inputs that differ are still compared.
* `structure`: the computing ops of each side are grouped into units with an op family
  (`dot_general` ~ `aten::mm`; `dot_general` + bias `add` ~ `aten::addmm` / `linear`;
  `tanh`; `max` ~ `relu`; ...); ops that only move bytes (reshape, stage, aten::t,
  copy_, detach, ...) are skipped. The (family, output shape) sequences are aligned with
  the same Myers diff as same-framework traces.

A unit's inputs are the values its ops read from outside the unit; they are paired with
the other unit's inputs by bytes (equal, transposed, or reshaped) and then compared, so
"introduced here" works across frameworks although argument orders differ (`addmm(bias,
x, w.t())` vs `add(dot_general(x, kernel), bias)`).

Bounded work: every "first candidate of b with this property" lookup (equal hash,
transposed hash, equal size) goes through a `_Picker` (a queue of candidates per key, in
order), so pairing N inputs costs O(N), not O(N^2), with the same pairs as a scan in order.
"""

import collections
import dataclasses
import fnmatch
import json

import numpy as np

from ..errors import TraceError
from ..trace import schema
from ..trace.values import digest, parse_shape
from . import align as _align
from ..trace.blob import ValueReader
from .differ import BITWISE, Differ, comparable

PASSTHROUGH = {
    "stage", "reshape", "broadcast_in_dim", "convert_element_type", "transpose", "squeeze",
    "expand_dims", "copy", "copy_p", "device_put", "pjit", "jit", "closed_call", "core_call",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint", "name",
    "t", "view", "_unsafe_view", "detach", "lift_fresh", "copy_", "empty", "empty_strided",
    "uniform_", "normal_", "zeros", "zero_", "fill_", "ones", "_to_copy", "to", "expand", "alias",
    "clone", "contiguous", "unsqueeze", "permute", "as_strided", "input", "<input>", "select",
    "slice", "lift", "kaiming_uniform_", "resize_", "set_", "numpy_T", "_reshape_alias",
}
FAMILY = {
    "dot_general": "matmul", "mm": "matmul", "matmul": "matmul", "bmm": "matmul", "dot": "matmul",
    "mv": "matmul", "addmm": "linear", "linear": "linear", "add": "add", "add_any": "add",
    "max": "max", "maximum": "max", "relu": "max", "clamp_min": "max", "logistic": "sigmoid",
    "sigmoid": "sigmoid", "reduce_sum": "sum", "sum": "sum", "reduce_max": "amax", "amax": "amax",
    "integer_pow": "pow", "pow": "pow", "square": "pow", "rsqrt": "rsqrt", "neg": "neg",
    "exp": "exp", "log": "log", "tanh": "tanh", "mul": "mul", "sub": "sub", "div": "div",
    "sqrt": "sqrt", "erf": "erf", "gelu": "gelu", "mean": "mean", "softmax": "softmax",
    "_softmax": "softmax", "log_softmax": "log_softmax", "_log_softmax": "log_softmax",
}


def op_family(op):
    """Op family of an op name across frameworks; None for ops that only move bytes."""
    name = op[6:] if op.startswith("aten::") else op
    name = name.split(".", 1)[0]
    if name.startswith("jit:"):
        return None
    if name in PASSTHROUGH:
        return None
    if name.endswith("_") and not name.endswith("__") and name[:-1] in FAMILY:
        name = name[:-1]
    return FAMILY.get(name, name)


@dataclasses.dataclass
class Unit:
    events: list      # event ids, in order
    rep: int          # event whose outputs are the unit's outputs
    family: str
    shape: str
    label: str        # ops, for reports: "dot_general + add"


def _units(t, side):
    """Computing units of one trace in order."""
    ev = t.events
    n = len(ev)
    has_kids = np.zeros(n, bool)
    par = side.parent
    kid_of = par[(side.kind == schema.KIND_EQN) & (par >= 0) & (par < n)]
    has_kids[kid_of] = True
    call_kids = np.zeros(n, bool)
    c = side.call[(side.call >= 0) & (side.call < n)]
    call_kids[c] = True
    out = []
    for e in range(n):
        kind = int(side.kind[e])
        if kind in (schema.KIND_INPUT, schema.KIND_OPTIM):
            continue
        if kind == schema.KIND_CALL and call_kids[e]:
            continue  # its replayed equations stand for it
        if has_kids[e] and kind == schema.KIND_EQN:
            continue
        op = t.string(ev[e]["op"])
        fam = op_family(op)
        if fam is None:
            continue
        rows = t.value_rows(e, schema.ROLE_OUT)
        if not len(rows):
            continue
        shape = t.string(rows[0]["shape"])
        out.append(Unit([e], e, fam, shape, op[6:] if op.startswith("aten::") else op))
    # matmul followed by a bias add that reads it: one "linear" unit
    merged, i = [], 0
    while i < len(out):
        u = out[i]
        if u.family == "matmul" and i + 1 < len(out) and out[i + 1].family == "add":
            nxt = out[i + 1]
            prods = {int(r["producer"]) for r in t.input_rows(nxt.rep)}
            if u.rep in prods:
                merged.append(Unit(u.events + nxt.events, nxt.rep, "linear", nxt.shape,
                                   f"{u.label} + {nxt.label}"))
                i += 2
                continue
        merged.append(u)
        i += 1
    return merged


class _Picker:
    """Candidates 0..n-1 in order, taken at most once: `take(key)` gives the first
    candidate not yet taken with that key, like a scan of the remaining list, in O(1)
    amortised per call (one queue per key; taken candidates are dropped as met)."""

    def __init__(self, n):
        self.taken = [False] * n
        self.maps = {}

    def add(self, name, keys):
        """Index candidates by `keys` (one per candidate, None: no key) under `name`."""
        m = collections.defaultdict(collections.deque)
        for i, k in enumerate(keys):
            if k is not None:
                m[k].append(i)
        self.maps[name] = m

    def take(self, name, key):
        q = self.maps[name].get(key)
        while q and self.taken[q[0]]:
            q.popleft()
        if not q:
            return None
        i = q.popleft()
        self.taken[i] = True
        return i


def _first_out(t):
    """Per event of `t`: its first output row of the values table (table order, as
    `t.value_rows(e, ROLE_OUT)[0]`), or -1. Vectorised: one pass, not one lookup per event."""
    v = t.values
    idx = np.flatnonzero(v["role"] == schema.ROLE_OUT)
    events, first = np.unique(v["event"][idx], return_index=True)
    out = np.full(len(t), -1, np.int64)
    out[events] = idx[first]
    return out


def _comparable_rows(v):
    """`comparable(row)` for every row of a values table."""
    return (v["offset"] >= 0) & ((v["flags"] & (schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED)) == 0)


def _load_map(map_file):
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


def _matches(t, unit, pattern):
    e = t.events[unit.rep]
    ns, op = t.string(e["name_stack"]), t.string(e["op"])
    return any(fnmatch.fnmatchcase(s, pattern) for s in (ns, op, f"{ns}:{op}", unit.label))


class CrossDiffer(Differ):
    """A `Differ` whose pairs come from cross-framework pairing, not sequence identity."""

    def __init__(self, ta, tb, rtol=None, atol=None, map_file=None):
        strings = _align.StringIds()
        sa, sb = _align.prepare(ta, strings), _align.prepare(tb, strings)
        self.ta, self.tb, self.sa, self.sb = ta, tb, sa, sb
        user = _load_map(map_file)
        ua, ub = _units(ta, sa), _units(tb, sb)
        pairs = {}      # a rep -> (b rep, by)
        unit_a = {u.rep: u for u in ua}
        unit_b = {u.rep: u for u in ub}
        used_a, used_b = set(), set()
        for pa_, pb_ in user.items():
            la = [u for u in ua if _matches(ta, u, pa_)]
            lb = [u for u in ub if _matches(tb, u, pb_)]
            for x, y in zip(la, lb):
                if x.rep in used_a or y.rep in used_b:
                    continue
                pairs[x.rep] = (y.rep, "user map")
                used_a.add(x.rep)
                used_b.add(y.rep)
        ids = {}
        sig_a = np.array([ids.setdefault((u.family, u.shape), len(ids)) for u in ua], np.uint64)
        sig_b = np.array([ids.setdefault((u.family, u.shape), len(ids)) for u in ub], np.uint64)
        ra = [i for i, u in enumerate(ua) if u.rep not in used_a]
        rb = [i for i, u in enumerate(ub) if u.rep not in used_b]
        ia, ib, _ = _align.align_arrays(sig_a[ra], sig_b[rb])
        for i, j in zip(ia.tolist(), ib.tolist()):
            pairs[ua[ra[i]].rep] = (ub[rb[j]].rep, "structure")
        self.units_a, self.units_b = unit_a, unit_b
        self._transposed_hash = {}
        self._pair_leaves(pairs)
        a2b = np.full(len(ta), -1, np.int64)
        b2a = np.full(len(tb), -1, np.int64)
        for ea, (eb, _) in pairs.items():
            a2b[ea], b2a[eb] = eb, ea
        al = _align.Alignment(a2b, b2a, 0, 0)
        super().__init__(ta, tb, rtol, atol, alignment=al, sides=(sa, sb))
        self.pair_by = {ea: by for ea, (eb, by) in pairs.items()}
        self.pairs_list = sorted(pairs.items())

    # -- value pairing ---------------------------------------------------------------------
    def _thash(self, t, reader, row):
        """Hash of the transpose of a stored 2-D value (cached), or None."""
        key = (id(t), int(row["offset"]))
        if key in self._transposed_hash:
            return self._transposed_hash[key]
        h = None
        if comparable(row) and len(parse_shape(t.string(row["shape"]))) == 2:
            x = reader.read(row)
            h = digest(np.ascontiguousarray(x.T).tobytes()) if x is not None else None
        self._transposed_hash[key] = h
        return h

    def _pair_leaves(self, pairs):

        ta, tb = self.ta, self.tb
        self._rb_tmp = ValueReader(tb)
        fa, fb = _first_out(ta), _first_out(tb)
        la = np.flatnonzero((self.sa.kind == schema.KIND_INPUT) & (fa >= 0))
        lb = np.flatnonzero((self.sb.kind == schema.KIND_INPUT) & (fb >= 0))
        # every stored b output (leaves first) by hash and by transposed hash
        ops = tb.events["op"]
        moves = [i for i in np.unique(ops).tolist() if op_family(tb.string(i)) is None]
        other = np.isin(ops, moves) & (self.sb.kind != schema.KIND_OPTIM) & (fb >= 0)
        other[lb] = False
        candidates = np.concatenate([lb, np.flatnonzero(other)])
        vb = tb.values
        rows = fb[candidates]
        ok = _comparable_rows(vb[rows])
        by_hash, by_thash, thash_built = {}, {}, False
        for h, e in zip(vb["hash"][rows[ok]].tolist(), candidates[ok].tolist()):
            by_hash.setdefault(h, e)
        used_b = {eb for eb, _ in pairs.values()}
        left_a = []
        va = ta.values
        for ea in la.tolist():
            row = va[fa[ea]]
            if not comparable(row):
                continue
            eb = by_hash.get(int(row["hash"]))
            if eb is None and len(parse_shape(ta.string(row["shape"]))) == 2:
                if not thash_built:   # once (each value read once), only when needed
                    thash_built = True
                    for e, r in zip(candidates.tolist(), rows.tolist()):
                        th = self._thash(tb, self._rb_tmp, vb[r])
                        if th is not None:
                            by_thash.setdefault(th, e)
                eb = by_thash.get(int(row["hash"]))
            if eb is not None and eb not in used_b:
                pairs[ea] = (eb, "value")
                used_b.add(eb)
            else:
                left_a.append((ea, int(row["nbytes"])))
        left_b = [(e, int(n)) for e, n in zip(lb.tolist(), vb["nbytes"][fb[lb]].tolist())
                  if e not in used_b]
        pick = _Picker(len(left_b))    # the first remaining b input of the same size
        pick.add("nbytes", [nb for _, nb in left_b])
        for ea, na in left_a:
            k = pick.take("nbytes", na)
            if k is not None:
                pairs[ea] = (left_b[k][0], "structure")

    # -- comparison ------------------------------------------------------------------------
    def transform_b(self, row_a, row_b, xa, xb):
        xa, xb = np.asarray(xa), np.asarray(xb)
        if xa.shape == xb.shape:
            return xb
        if xb.ndim == 2 and xa.shape == xb.T.shape:
            return xb.T
        if xa.size == xb.size:
            return xb.reshape(xa.shape)
        return xb

    def _unit_inputs(self, t, side, unit):
        """[(label, value row or None, reason)] of the values a unit reads from outside."""
        inside = set(unit.events)
        out = []
        for e in unit.events:
            for r in t.input_rows(e):
                p, ps = int(r["producer"]), int(r["producer_slot"])
                if p in inside or p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                    continue
                if p < 0:
                    out.append((f"input {int(r['slot'])} of {t.string(t.events[e]['op'])}", None,
                                "unknown producer"))
                    continue
                row = side.value_row(p, ps)
                out.append((self._describe(t, side, p, row), row, ""))
        return out

    @staticmethod
    def _describe(t, side, p, row):
        """'input [4, 64] (event 4 via stage 5)': follow byte-moving ops back to the source."""
        src, hops = p, 0
        while hops < 6 and side.kind[src] != schema.KIND_INPUT and \
                op_family(t.string(t.events[src]["op"])) is None:
            prods = [int(r["producer"]) for r in t.input_rows(src) if int(r["producer"]) >= 0]
            if len(prods) != 1:
                break
            src, hops = prods[-1], hops + 1
        shape = t.string(row["shape"]) if row is not None else "?"
        name = t.string(t.events[src]["op"])
        text = f"{name} [{shape}] (event {src}"
        return text + (f" via {t.string(t.events[p]['op'])} {p})" if src != p else ")")

    def inputs_match(self, ea, eb, level):
        ua, ub = self.units_a.get(ea), self.units_b.get(eb)
        if ua is None or ub is None:
            return True, "an external input or parameter (paired by " + \
                self.pair_by.get(ea, "structure") + ")", []
        ins_a = self._unit_inputs(self.ta, self.sa, ua)
        ins_b = self._unit_inputs(self.tb, self.sb, ub)
        free_b = [x for x in ins_b if x[1] is not None and comparable(x[1])]
        pick = _Picker(len(free_b))    # the first remaining input of b by bytes, then size
        pick.add("hash", [int(r["hash"]) for _, r, _ in free_b])
        pick.add("nbytes", [int(r["nbytes"]) for _, r, _ in free_b])
        bad, unknown, matched = [], [], []
        for label, row, why in ins_a:
            if row is None or not comparable(row):
                unknown.append(f"{label}: {why or 'not stored'}")
                continue
            k = pick.take("hash", int(row["hash"]))                  # identical bytes
            if k is None:                                            # transposed bytes
                if "thash" not in pick.maps:
                    pick.add("thash", [None if pick.taken[i] else
                                       self._thash(self.tb, self.rb, r)
                                       for i, (_, r, _) in enumerate(free_b)])
                k = pick.take("thash", int(row["hash"]))
            if k is None:                                            # same size: compare numbers
                k = pick.take("nbytes", int(row["nbytes"]))
            if k is None:
                unknown.append(f"{label}: no counterpart among the inputs of b")
                continue
            lb_, rb_, _ = free_b[k]
            m = self.compare_rows(row, rb_)
            shape_a = parse_shape(self.ta.string(row["shape"]))
            shape_b = parse_shape(self.tb.string(rb_["shape"]))
            how = "" if shape_a == shape_b else (
                " (transposed)" if shape_a == tuple(reversed(shape_b)) and len(shape_a) == 2
                else " (reshaped)")
            ok = m is not None and (m["bitwise_equal"] if level == BITWISE else m["within_tolerance"])
            entry = {"input": label, "b": lb_ + how, "metrics": m}
            (matched if ok else bad).append(entry)
        if bad:
            return False, f"{len(bad)} of its inputs differ: " + ", ".join(
                f"{d['input']} vs b {d['b']}" for d in bad[:3]), bad
        if unknown:
            return None, "; ".join(unknown[:3]), []
        word = "bitwise" if level == BITWISE else "within tolerance"
        return True, (f"all {len(matched)} inputs and parameters match ({word}): " +
                      ", ".join(f"{d['input']} = b {d['b']}" for d in matched[:4])), []

    def search(self, level):
        for ea, (eb, by) in self.pairs_list:
            if self.equal_at(ea, eb, level):
                continue
            ua, ub = self.units_a.get(ea), self.units_b.get(eb)
            note = ""
            if ua is not None and ub is not None:
                note = (f"a: {ua.label} (events {', '.join(map(str, ua.events))}) paired with "
                        f"b: {ub.label} (events {', '.join(map(str, ub.events))}) by {by}, "
                        f"op family {ua.family}")
            return self.finding(ea, eb, level, note=note), None
        return None, None

    def mapping(self, limit=200):
        out = []
        for ea, (eb, by) in self.pairs_list[:limit]:
            ua, ub = self.units_a.get(ea), self.units_b.get(eb)
            out.append({"a": ea, "b": eb, "by": by,
                        "a_op": ua.label if ua else self.ta.string(self.ta.events[ea]["op"]),
                        "b_op": ub.label if ub else self.tb.string(self.tb.events[eb]["op"]),
                        "family": ua.family if ua else "input",
                        "a_name_stack": self.ta.string(self.ta.events[ea]["name_stack"]),
                        "b_name_stack": self.tb.string(self.tb.events[eb]["name_stack"])})
        return out


def cross_differ(ta, tb, rtol=None, atol=None, map_file=None):
    """(CrossDiffer, mapping list) for two traces of different frameworks."""
    d = CrossDiffer(ta, tb, rtol, atol, map_file)
    return d, d.mapping()
