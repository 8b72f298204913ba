"""Pair the computations of two runs of different frameworks (a Flax model and its
PyTorch port) by dataflow, dtype and role.

Why: the two programs run different ops in a different order (an init-time forward on
`jnp.ones`, a bias add vs `addmm`, eight LayerNorm equations vs one aten op, transposed
and permuted weights), so pairing by sequence or by equal bytes pairs the wrong things.
Values anchor the pairing instead, and dataflow carries it forward:

1. Units. The computing ops of each side (byte-moving ops skipped), a matmul or conv
   merged with the bias add that reads it, a jitted `gelu`/`softmax`/... kept whole.
   Optimizer ops are left to the snapshots (align/optroles.py); forward and backward are
   paired separately.
2. Atoms. Every value a unit reads (and the values it was moved from) is fingerprinted:
   dtype and exact bytes, whatever the shape (a reshape or transpose view keeps the
   bytes); integers by value in any width (int32 tokens == int64 tokens, never == a
   float); arrays of 2+ dims left over by the multiset of their elements, confirmed by an
   axis permutation (HWIO kernel == OIHW weight). A fingerprint seen on both sides is an
   atom: the same input or parameter. 0-d values (seeds, counters, hyper-parameters)
   are never atoms. The optimizer's updated parameters are atoms by role.
3. Support. A unit's support is the set of atoms it depends on, following the dataflow
   back through byte-moving ops and other units and stopping at atoms; a value only one
   side has (a PRNG key, the ones of an init-time forward) adds a token of its own side,
   so what reads it cannot pair.
4. Classes. Units with the same support and phase compute from the same atoms. In the
   forward (`_pair_forward`), units of the same (op family, size, dtype) pair only when
   their direct inputs pair; where the two sides reach one value by other ops (scale
   before or after a matmul, a composite against one aten op), the points where values
   meet pair, else the last units after the class's last pair, else two modules' outputs,
   each region between compared as one unit. Backward units pair by symbol and direct
   inputs (ties to the latest), carrying the module pairs of the forward.
5. A user map (`{"MLP/fc1": "fc1"}`) confines the units of the modules it names to each
   other, never across op families, and pairs what dataflow left there by structure.

Every pair says how it was made (`by`, `how`).
"""

import collections
import dataclasses
import fnmatch
import itertools
import re

import numpy as np

from ...trace import schema
from ...trace.values import digest, parse_shape
from ..align import sequence as _align
from ..differ import comparable

PASSTHROUGH = {
    "stage", "reshape", "broadcast_in_dim", "convert_element_type", "transpose", "squeeze",
    "expand_dims", "copy", "copy_p", "device_put", "pjit", "jit", "closed_call", "core_call",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint", "name",
    "t", "view", "_unsafe_view", "detach", "lift_fresh", "copy_", "empty", "empty_strided",
    "uniform_", "normal_", "zeros", "zero_", "fill_", "ones", "_to_copy", "to", "expand", "alias",
    "clone", "contiguous", "unsqueeze", "permute", "as_strided", "input", "<input>", "select",
    "slice", "lift", "kaiming_uniform_", "resize_", "set_", "numpy_T", "_reshape_alias",
    "stop_gradient", "optimization_barrier", "zeros_like", "ones_like", "full", "full_like",
    "empty_like", "split", "split_with_sizes", "unbind", "chunk", "view_as", "reshape_as",
    "flatten", "unflatten", "transpose_", "new_empty", "new_zeros", "new_ones", "scalar_tensor",
}
FAMILY = {
    "dot_general": "matmul", "mm": "matmul", "matmul": "matmul", "bmm": "matmul", "dot": "matmul",
    "mv": "matmul", "einsum": "matmul", "addmm": "linear", "linear": "linear", "add": "add",
    "add_any": "add", "max": "max", "maximum": "max", "relu": "max", "clamp_min": "max",
    "logistic": "sigmoid", "sigmoid": "sigmoid", "reduce_sum": "sum", "sum": "sum",
    "reduce_max": "amax", "amax": "amax", "integer_pow": "pow", "pow": "pow", "square": "pow",
    "rsqrt": "rsqrt", "neg": "neg", "exp": "exp", "log": "log", "tanh": "tanh", "mul": "mul",
    "sub": "sub", "div": "div", "sqrt": "sqrt", "erf": "erf", "gelu": "gelu", "mean": "mean",
    "softmax": "softmax", "_softmax": "softmax", "log_softmax": "log_softmax",
    "_log_softmax": "log_softmax", "conv_general_dilated": "conv", "convolution": "conv",
    "_convolution": "conv", "conv2d": "conv", "conv1d": "conv", "conv3d": "conv",
    "mkldnn_convolution": "conv", "native_layer_norm": "layer_norm", "layer_norm": "layer_norm",
    "embedding": "gather", "gather": "gather", "take": "gather", "index_select": "gather",
    "silu": "silu", "baddbmm": "linear", "addbmm": "linear",
    "native_batch_norm": "batch_norm", "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit": "batch_norm", "batch_norm": "batch_norm",
}
# jitted library functions that are one op in torch: kept as one unit
COMPOSITE = {"gelu": "gelu", "softmax": "softmax", "_softmax": "softmax",
             "log_softmax": "log_softmax", "_log_softmax": "log_softmax", "silu": "silu",
             "swish": "silu", "relu": "max", "sigmoid": "sigmoid", "logsumexp": "logsumexp",
             "standardize": "layer_norm", "_standardize": "layer_norm", "relu6": "relu6",
             "elu": "elu", "leaky_relu": "leaky_relu", "softplus": "softplus"}
# how each side calls a layer of this family (for findings: "Dense MLP/fc1 <-> Linear fc1")
LAYER_KIND = {"linear": ("Dense", "Linear"), "conv": ("Conv", "Conv"),
              "layer_norm": ("LayerNorm", "LayerNorm"), "gather": ("Embed", "Embedding"),
              "batch_norm": ("BatchNorm", "BatchNorm"), "gelu": ("gelu", "GELU"),
              "softmax": ("softmax", "softmax")}

PHASE_FWD, PHASE_BWD = 0, 1
MAX_DEPTH = 200             # passthrough hops followed back from one value
MAX_FINGERPRINT_BYTES = 256 << 20   # values read to fingerprint permuted arrays
MAX_PERM_DIMS = 5
GRADS_TAG = "tracediff:optax/grads/"
MAX_SUPPORT_ELEMENTS = 20_000_000   # atoms held by the distinct supports of one side
MAX_FORWARD_PASSES = 4              # sweeps over the forward classes (a later class may feed one)
MAX_MEET_COMPARISONS = 2000         # value comparisons per class to find where two sides meet


def op_family(op):
    """Op family of an op name across frameworks; None for ops that only move bytes."""
    name = op[6:] if op.startswith("aten::") else op
    name = name.split(".", 1)[0]
    if name.startswith("jit:"):
        return COMPOSITE.get(name[4:].rsplit(".", 1)[-1])
    if name in PASSTHROUGH:
        return None
    if name.endswith("_") and not name.endswith("__") and name[:-1] in FAMILY:
        name = name[:-1]
    return FAMILY.get(name, name)


def module_path(name_stack, framework):
    """A module path comparable across frameworks: JAX transforms dropped
    ('transpose(jvp(MLP))/fc1' -> 'MLP/fc1'), torch dots as slashes ('blocks.0' ->
    'blocks/0')."""
    if framework == schema.FW_JAX:
        s = re.sub(r"[A-Za-z_][\w]*\(", "", name_stack).replace(")", "")
    else:
        s = name_stack.replace(".", "/")
    return re.sub(r"/+", "/", s).strip("/")


def is_int(dtype):
    return dtype.startswith(("int", "uint")) or dtype == "bool"


@dataclasses.dataclass
class Unit:
    events: list      # event ids, in order
    rep: int          # the event whose outputs are the unit's outputs
    family: str
    shape: tuple
    size: int
    dtype: str
    label: str        # ops, for reports: "dot_general + add"
    module: str       # module_path() of the rep's name stack
    phase: int        # PHASE_FWD / PHASE_BWD


def permutations_to(shape_a, shape_b):
    """Axis orders p of `shape_a` such that b reshaped to (shape_a[p[0]], ...) and
    transposed back has a's shape, most natural first: identity (a reshape), the 2-D
    transpose, channels last <-> first, then the rest."""
    n = len(shape_a)
    size_b = int(np.prod(shape_b, dtype=np.int64)) if shape_b else 1
    size_a = int(np.prod(shape_a, dtype=np.int64)) if shape_a else 1
    if size_a != size_b:
        return []
    ident = tuple(range(n))
    if n > MAX_PERM_DIMS:
        return [ident]
    pref = [ident, tuple(reversed(ident))]
    if n >= 3:
        pref.append((0, n - 1) + tuple(range(1, n - 1)))      # NHWC <- NCHW
        pref.append((n - 1, n - 2) + tuple(range(n - 2)))      # HWIO <- OIHW
    seen, out = set(), []
    for p in pref + list(itertools.permutations(ident)):
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def apply_perm(xb, shape_a, p):
    """b's array as a's layout under axis order `p` (see `permutations_to`)."""
    return np.asarray(xb).reshape([shape_a[i] for i in p]).transpose(np.argsort(p))


def find_layout(xa, xb):
    """The axis order under which b's array equals a's bitwise, or None."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.dtype != xb.dtype:
        return None
    raw = xa.tobytes()
    for p in permutations_to(xa.shape, xb.shape):
        y = apply_perm(xb, xa.shape, p)
        if y.tobytes() == raw if y.flags.c_contiguous else np.ascontiguousarray(y).tobytes() == raw:
            return p
    return None


class SideGraph:
    """One side of the comparison: its units and how the values they read came to be."""

    def __init__(self, t, side, framework, name, reader):
        self.t, self.side, self.fw, self.name, self.reader = t, side, framework, name, reader
        ev = t.events
        n = len(ev)
        self.n = n
        self.mask = ev["framework"] == framework
        self.kind = side.kind
        self.parent = side.parent
        self.call = side.call
        self.phase = ev["phase"]
        self._shape_cache = {}
        self._key_cache = {}
        self.fam_of = {int(i): op_family(t.string(i)) for i in np.unique(ev["op"]).tolist()} \
            if n else {}
        kids = np.zeros(n, bool)
        par = self.parent[(self.kind == schema.KIND_EQN) & (self.parent >= 0) & (self.parent < n)]
        kids[par] = True
        self.has_kids = kids
        self.optimizer = self._optimizer_mask()
        self.units, self.unit_of = self._units()
        self._kid_by_hash = {}
        self._inputs = {}       # unit rep -> input_nodes()
        self._by_parent = None
        self.nodes = {}         # value node -> (row, preds, term)
        self.support = [None] * len(self.units)

    # -- units ------------------------------------------------------------------------------
    def op(self, e):
        return self.t.string(self.t.events["op"][e])

    def _optimizer_mask(self):
        """JAX: the equations of an optax update (dataflow descendants of the tagged grads,
        in the same call or eager step); torch: ops the recorder ran in optimizer.step."""
        n, t = self.n, self.t
        mask = np.zeros(n, bool)
        if self.fw != schema.FW_JAX:
            return mask
        ev = t.events
        name_ops = [i for i, f in self.fam_of.items() if f is None and t.string(i) == "name"]
        tags = np.flatnonzero(np.isin(ev["op"], name_ops) & self.mask) if name_ops else []
        seeds = [e for e in np.asarray(tags).tolist() if GRADS_TAG in t.string(ev["params"][e])]
        if not seeds:
            return mask
        mask[seeds] = True
        inp = t.inputs
        order = np.argsort(inp["event"], kind="stable")
        cons, prod = inp["event"][order], inp["producer"][order]
        start = int(min(seeds))
        lo = int(np.searchsorted(cons, start))
        step = ev["step"]
        for c, p in zip(cons[lo:].tolist(), prod[lo:].tolist()):
            if mask[c] or p < 0 or not mask[p] or not self.mask[c]:
                continue
            if self.kind[c] in (schema.KIND_EQN, schema.KIND_EAGER) and \
                    self.call[c] == self.call[p] and step[c] == step[p]:
                mask[c] = True
        return mask

    def _units(self):
        t, n = self.t, self.n
        ev = t.events
        first = _first_out(t)
        inside = np.zeros(n, bool)
        out = []
        for e in np.flatnonzero(self.mask).tolist():
            kind = int(self.kind[e])
            par = int(self.parent[e])
            if kind == schema.KIND_EQN and 0 <= par < n and inside[par]:
                inside[e] = True
                continue
            if kind in (schema.KIND_INPUT, schema.KIND_OPTIM):
                continue
            if self.phase[e] == schema.PHASE_OPTIM or self.optimizer[e]:
                continue
            fam = self.fam_of.get(int(ev["op"][e]))
            op = t.string(ev["op"][e])
            composite = op.startswith("jit:") and fam is not None
            if composite:
                inside[e] = True          # its equations are inside it
            elif kind == schema.KIND_CALL or (kind == schema.KIND_EQN and self.has_kids[e]):
                continue                  # its replayed equations stand for it
            if fam is None or first[e] < 0:
                continue
            row = t.values[first[e]]
            shape = self.shape(row)
            ns = t.string(ev["name_stack"][e])
            phase = PHASE_BWD if (self.phase[e] == schema.PHASE_BWD or
                                  (self.fw == schema.FW_JAX and "transpose(" in ns)) else PHASE_FWD
            label = op[6:] if op.startswith("aten::") else op
            out.append(Unit([e], e, fam, shape, _size(shape), t.string(row["dtype"]),
                            label.split(".", 1)[0] if op.startswith("aten::") else label,
                            module_path(ns, self.fw), phase))
        # a matmul or conv followed by the bias add that reads it: one layer
        merged, i = [], 0
        while i < len(out):
            u = out[i]
            if u.family in ("matmul", "conv") and i + 1 < len(out) and out[i + 1].family == "add":
                nxt = out[i + 1]
                prods = {int(r["producer"]) for r in t.input_rows(nxt.rep)}
                if u.rep in prods and nxt.size == u.size:
                    merged.append(Unit(u.events + nxt.events, nxt.rep,
                                       "linear" if u.family == "matmul" else "conv", nxt.shape,
                                       nxt.size, nxt.dtype, f"{u.label} + {nxt.label}",
                                       nxt.module, nxt.phase))
                    i += 2
                    continue
            merged.append(u)
            i += 1
        unit_of = np.full(n, -1, np.int64)
        for k, u in enumerate(merged):
            unit_of[u.events] = k
        if self.fw == schema.FW_JAX:
            self._derivative_units(merged)
        return merged, unit_of

    def _derivative_units(self, units):
        """Mark as backward the JAX units that `jvp` computes in the forward pass only for
        the backward: residuals such as the loss derivative's `2 * h` of `jnp.mean(h ** 2)`
        or a LayerNorm's `rsqrt` derivative, read by `transpose(...)` equations alone (through
        byte-moving ops). Torch computes them in its backward ops; left in the forward they
        join a forward class and end a composite (a LayerNorm paired at `2 * h`)."""
        t = self.t
        ns = t.events["name_stack"]
        stacks = {int(x): t.string(x) for x in np.unique(ns[self.mask]).tolist()}
        jvp = {k for k, v in stacks.items() if "jvp(" in v and "transpose(" not in v}
        if not jvp:
            return
        bwd_stack = {k for k, v in stacks.items() if "transpose(" in v}
        inp = t.inputs
        order = np.argsort(inp["producer"], kind="stable")
        prod, cons = inp["producer"][order], inp["event"][order]

        def consumers(e):
            lo, hi = np.searchsorted(prod, [e, e + 1])
            return np.unique(cons[lo:hi]).tolist()

        memo = {}

        def only_backward(e, depth=0):
            """True when every computing reader of e's outputs is a backward equation
            (None: nothing reads them)."""
            if e in memo:
                return memo[e]
            memo[e] = None
            seen_any, ok = False, True
            for c in consumers(e):
                if not self.mask[c] or c == e:
                    continue
                if int(ns[c]) in bwd_stack or self.phase[c] == schema.PHASE_BWD:
                    seen_any = True
                    continue
                if self.fam_of.get(int(t.events["op"][c])) is None and depth < 8 and \
                        self.kind[c] == schema.KIND_EQN and not self.has_kids[c]:
                    r = only_backward(c, depth + 1)   # a byte-moving op: its readers
                    if r is None:
                        continue
                    seen_any |= r
                    ok &= r
                else:
                    ok = False
                if not ok:
                    break
            memo[e] = (seen_any and ok) if seen_any or not ok else None
            return memo[e]

        for u in units:
            if u.phase == PHASE_FWD and int(ns[u.rep]) in jvp and only_backward(u.rep):
                u.phase = PHASE_BWD

    def shape(self, row):
        k = int(row["shape"])
        hit = self._shape_cache.get(k)
        if hit is None:
            try:
                hit = tuple(parse_shape(self.t.string(k)))
            except ValueError:
                hit = ()
            self._shape_cache[k] = hit
        return hit

    # -- value fingerprints ---------------------------------------------------------------
    def key(self, row):
        """Exact fingerprint of a value, or None (0-d, PRNG key, uninitialised, not hashed):
        ('b', dtype, hash of the bytes) for floats, ('i', kind, hash of the int64 values)
        for integers and bools."""
        if row is None:
            return None
        ck = (int(row["event"]), int(row["slot"]), int(row["role"]))
        if ck in self._key_cache:
            return self._key_cache[ck]
        k = None
        flags = int(row["flags"])
        dt = self.t.string(row["dtype"])
        if not flags & schema.VFLAG_UNINIT and len(self.shape(row)) and \
                not dt.startswith("key<") and (comparable(row) or flags & schema.VFLAG_STATS):
            if is_int(dt) and comparable(row) and int(row["nbytes"]) <= (8 << 20):
                x = self.reader.read(row)
                k = ("i", "bool" if dt == "bool" else "int",
                     digest(np.ascontiguousarray(np.asarray(x).astype(np.int64)).tobytes()))
            else:
                k = ("b", dt, int(row["hash"]))
        self._key_cache[ck] = k
        return k

    # -- dataflow back from a value -------------------------------------------------------
    def input_nodes(self, unit):
        """[(consumer event, slot, node)] of the values a unit reads from outside it."""
        hit = self._inputs.get(unit.rep)
        if hit is not None:
            return hit
        inside = set(unit.events)
        out = []
        for e in unit.events:
            for r in self.t.input_rows(e):
                p, ps = int(r["producer"]), int(r["producer_slot"])
                if p in inside or p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                    continue
                out.append((e, int(r["slot"]), self.node(e, p, ps)))
        self._inputs[unit.rep] = out
        return out

    def node(self, consumer, p, ps):
        """A value as read by `consumer`: (producer, slot, read as the call's argument)."""
        arg = 0 <= p < self.n and self.kind[p] == schema.KIND_CALL and \
            consumer is not None and self.call[consumer] == p
        key = (p, ps, bool(arg), consumer if p < 0 else -1)
        if key not in self.nodes:
            self.nodes[key] = self._expand(consumer, p, ps, arg)
        return key

    def _expand(self, consumer, p, ps, arg):
        """(row, [pred nodes], term) of a value node; term: ('unit', k), ('leaf',) (an input
        of this side), ('const',) (made of literals) or None (follow the preds)."""
        t = self.t
        if p < 0 or p >= self.n or not self.mask[p]:
            return None, [], ("leaf",)
        if arg:
            row = self.side.value_row(p, ps, schema.ROLE_IN)
            preds = [self.node(p, int(r["producer"]), int(r["producer_slot"]))
                     for r in t.input_rows(p) if int(r["slot"]) == ps and int(r["producer"]) >= 0]
            return row, preds, (None if preds else ("leaf",))
        row = self.side.value_row(p, ps)
        u = int(self.unit_of[p])
        if u >= 0:
            return row, [], ("unit", u)
        kind = int(self.kind[p])
        if kind in (schema.KIND_INPUT, schema.KIND_OPTIM):
            return row, [], ("leaf",)
        ins = [r for r in t.input_rows(p) if int(r["producer"]) >= 0]
        if kind == schema.KIND_CALL or (kind == schema.KIND_EQN and self.has_kids[p]):
            kid = self._kid_with(p, row)
            if kid is not None:
                return row, [self.node(None, kid[0], kid[1])], None
            preds = [self.node(p, int(r["producer"]), int(r["producer_slot"])) for r in ins]
            return row, preds, (None if preds else ("leaf",))
        if self.fam_of.get(int(t.events["op"][p])) is not None:
            return row, [], ("leaf",)   # an op paired elsewhere (optimizer) or not at all
        if self.op(p).split(".", 1)[0] in ("aten::copy_", "copy_"):
            ins = [r for r in ins if int(r["slot"]) == 1] or ins
        preds = [self.node(p, int(r["producer"]), int(r["producer_slot"])) for r in ins]
        if not preds and all(int(r["producer"]) in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST)
                             for r in t.input_rows(p)):
            return row, [], ("const",)   # a fill of literals (zeros, ones, a broadcast 0.0)
        return row, preds, (None if preds else ("leaf",))

    def _kid_with(self, container, row):
        """(event, slot) of the equation inside a call or nested jit that produced the same
        bytes as the container's output `row` (compiled == replayed), or None."""
        if row is None:
            return None
        table = self._kid_by_hash.get(container)
        if table is None:
            table = {}
            kids = self._kids(container)
            for k in kids.tolist():
                for r in self.t.value_rows(k, schema.ROLE_OUT):
                    table[(int(r["hash"]), int(r["dtype"]), int(r["shape"]))] = (k, int(r["slot"]))
            self._kid_by_hash[container] = table
        return table.get((int(row["hash"]), int(row["dtype"]), int(row["shape"])))

    def _kids(self, container):
        """The equations whose parent is `container` (a call or a nested jit), from an
        index built once (not a scan of the trace per container)."""
        if self._by_parent is None:
            eqn = np.flatnonzero(self.kind == schema.KIND_EQN)
            par = self.parent[eqn]
            order = np.argsort(par, kind="stable")
            self._by_parent = (par[order], eqn[order])
        keys, vals = self._by_parent
        lo, hi = np.searchsorted(keys, [container, container + 1])
        return vals[lo:hi]

    def walk_rows(self, node, limit=8, seen=None):
        """[(row, made by a unit)] of a value node and of the values it was moved from (a
        few hops); nodes in `seen` (updated) are skipped."""
        out, stack = [], [(node, 0)]
        seen = set() if seen is None else seen
        while stack:
            nd, d = stack.pop()
            if nd in seen:
                continue
            seen.add(nd)
            row, preds, term = self.nodes[nd]
            if row is not None:
                out.append((row, term is not None and term[0] == "unit"))
            if term is None and d < limit:
                stack.extend((q, d + 1) for q in preds)
        return out


def _size(shape):
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _first_out(t):
    """Per event: its first output row in the values table, or -1 (vectorised)."""
    v = t.values
    idx = np.flatnonzero(v["role"] == schema.ROLE_OUT)
    out = np.full(len(t), -1, np.int64)
    if len(idx):
        # the slot-0 row when there is one: sort by (event, slot)
        order = idx[np.lexsort((v["slot"][idx], v["event"][idx]))]
        events, first = np.unique(v["event"][order], return_index=True)
        out[events] = order[first]
    return out


@dataclasses.dataclass
class Pair:
    a: int            # unit index on a
    b: int            # unit index on b
    by: str           # "dataflow", "dataflow (values meet)", "module output",
    how: str          # "dataflow (composite)", "user map", "structure"
    modules: tuple = None   # (a module, b module) whose outputs a "module output" pair is


class Pairing:
    """The pairs of two `SideGraph`s (see the module docstring)."""

    def __init__(self, ga, gb, user_map=None, role_rows=(), agree=None):
        self.ga, self.gb = ga, gb
        self.agree = agree         # agree(row a, row b): equal within tolerance (values meet)
        self._mod_pairs = {}       # a module -> b module, from the paths of paired units
        self._same_value = [None, None]   # per side: (hash, dtype, shape) -> units
        self.user_map = list((user_map or {}).items())
        self.atoms = {}            # fingerprint -> atom id
        self.atom_rows = {}        # atom id -> (row a, row b, how)
        self.row_atom = [{}, {}]   # per side: (event, slot, role) -> atom id (permuted matches)
        self.layouts = {}          # (a row key, b row key) -> axis order found for an atom
        self._build_atoms(role_rows)
        for g, s in ((ga, 0), (gb, 1)):
            self._supports(g, s)
        self.pairs = []
        self.pair_of = [dict(), dict()]   # unit index -> pair index, per side
        self.groups = [self._groups(ga, 0), self._groups(gb, 1)]
        self._pair_forward()
        self.module_map = self._module_map()
        self._pair_phase(PHASE_BWD)
        self._pair_user_leftovers()

    # -- atoms ------------------------------------------------------------------------------
    def atom(self, side, row):
        """Atom id of a value row of one side, or None."""
        if row is None:
            return None
        g = self.ga if side == 0 else self.gb
        a = self.row_atom[side].get((int(row["event"]), int(row["slot"]), int(row["role"])))
        if a is not None:
            return a
        k = g.key(row)
        return self.atoms.get(k) if k is not None else None

    def _build_atoms(self, role_rows):
        seen = [collections.OrderedDict(), collections.OrderedDict()]   # key -> row
        rows_of = [[], []]
        computed = [set(), set()]
        for g, s in ((self.ga, 0), (self.gb, 1)):
            visited = set()
            for u in g.units:
                for _, _, nd in g.input_nodes(u):
                    for row, by_unit in g.walk_rows(nd, seen=visited):
                        rows_of[s].append(row)
                        k = g.key(row)
                        if k is not None and k not in seen[s]:
                            seen[s][k] = row
                        if k is not None and by_unit:
                            computed[s].add(k)
        # a value both sides compute (a layer's output that happens to be equal) is not a
        # cut: what reads it depends on what computed it, as on the other side
        self.computed = computed[0] & computed[1]
        for k, row in seen[0].items():
            rb = seen[1].get(k)
            if rb is not None:
                aid = len(self.atom_rows)
                self.atoms[k] = aid
                sa_, sb_ = self.ga.shape(row), self.gb.shape(rb)
                how = "equal bytes" if sa_ == sb_ else ("equal values" if k[0] == "i" and
                                                        self.ga.t.string(row["dtype"]) !=
                                                        self.gb.t.string(rb["dtype"])
                                                        else "equal bytes, other shape")
                if k[0] == "i" and self.ga.t.string(row["dtype"]) != self.gb.t.string(rb["dtype"]):
                    how = (f"equal values ({self.ga.t.string(row['dtype'])} vs "
                           f"{self.gb.t.string(rb['dtype'])})")
                self.atom_rows[aid] = (row, rb, how)
        self._permuted_atoms(rows_of, seen)
        for ra, rb in role_rows:          # updated parameters, by optimizer role
            ka, kb = self.ga.key(ra), self.gb.key(rb)
            if ka is None or kb is None:
                continue
            aid = self.atoms.get(ka, self.atoms.get(kb))
            if aid is None:
                aid = len(self.atom_rows)
                self.atom_rows[aid] = (ra, rb, "the same parameter after an optimizer step "
                                                "(by role)")
            self.atoms.setdefault(ka, aid)
            self.atoms.setdefault(kb, aid)

    def _permuted_atoms(self, rows_of, seen):
        """Float arrays of 2+ dims without an exact match: the same elements in another
        axis order (a conv kernel HWIO vs OIHW) make an atom too."""
        def pending(g, s):
            out = {}
            for row in rows_of[s]:
                k = g.key(row)
                if k is None or k[0] != "b" or k in self.atoms or not comparable(row):
                    continue
                if len(g.shape(row)) < 2:
                    continue
                out.setdefault((k[1], int(row["nbytes"])), {})[k] = row
            return out

        pa, pb = pending(self.ga, 0), pending(self.gb, 1)
        budget = MAX_FINGERPRINT_BYTES
        for sig in pa.keys() & pb.keys():
            fps = {}
            for g, s, rows in ((self.ga, 0, pa[sig]), (self.gb, 1, pb[sig])):
                for k, row in rows.items():
                    budget -= int(row["nbytes"])
                    if budget < 0:
                        return
                    x = np.asarray(g.reader.read(row))
                    bits = np.sort(np.ascontiguousarray(x).reshape(-1).view(
                        {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(x.itemsize, np.uint8)))
                    fps.setdefault(digest(bits.tobytes()), ([], []))[s].append((row, x))
            for fa_list, fb_list in fps.values():
                for (ra, xa), (rb, xb) in zip(fa_list, fb_list):
                    p = find_layout(xa, xb)
                    if p is None:
                        continue
                    aid = len(self.atom_rows)
                    self.atom_rows[aid] = (ra, rb, f"equal after permuting axes {tuple(p)}")
                    self.row_atom[0][(int(ra["event"]), int(ra["slot"]), int(ra["role"]))] = aid
                    self.row_atom[1][(int(rb["event"]), int(rb["slot"]), int(rb["role"]))] = aid
                    # every row of either side with these exact bytes is that atom
                    self.atoms.setdefault(self.ga.key(ra), aid)
                    self.atoms.setdefault(self.gb.key(rb), aid)

    # -- support ----------------------------------------------------------------------------
    def _supports(self, g, s):
        memo = {}
        intern = {}

        def origins(nd, depth=0):
            hit = memo.get(nd)
            if hit is not None:
                return hit
            row, preds, term = g.nodes[nd]
            scalar = row is not None and not len(g.shape(row))
            a = self.atom(s, row)
            if a is not None and g.key(row) not in self.computed:
                res = frozenset([("a", a)])
            elif a is not None:
                # computed on both sides: what computed it, unless that was constants
                # alone (an arange, an iota): then the value itself
                res = (g.support[term[1]] if term is not None and term[0] == "unit"
                       and g.support[term[1]] is not None else
                       _union([origins(q, depth + 1) for q in preds])) or frozenset([("a", a)])
            elif term is not None and term[0] == "unit":
                res = g.support[term[1]]
                if res is None:
                    res = frozenset([("l", s, nd)])
            elif term is not None and term[0] == "const":
                res = frozenset()
            elif term is not None or depth > MAX_DEPTH:
                # an input only this side has; 0-d ones (seeds, counters, hyper-parameters)
                # are parameters of the computation, not data
                res = frozenset() if scalar else frozenset([("l", s, nd)])
            else:   # moved bytes: where they came from (constants contribute nothing)
                res = _union([origins(q, depth + 1) for q in preds])
            res = intern.setdefault(res, res)
            memo[nd] = res
            return res

        budget = MAX_SUPPORT_ELEMENTS   # bounded work on a hostile trace: new sets only
        for k, u in enumerate(g.units):
            if budget <= 0:                # what is left stays unpaired (never wrong)
                g.support[k] = frozenset([("l", s, ("budget", k))])
                continue
            parts = [origins(nd) for _, _, nd in g.input_nodes(u)]
            sup = _union(parts)
            if sup not in intern:
                intern[sup] = sup
                budget -= len(sup)
            g.support[k] = intern[sup]

    # -- pairing ----------------------------------------------------------------------------
    def _groups(self, g, s):
        """Per unit: the index of the user-map entry whose side-s pattern it matches, or -1."""
        out = np.full(len(g.units), -1, np.int64)
        if not self.user_map:
            return out
        for k, u in enumerate(g.units):
            e = g.t.events[u.rep]
            ns, op = g.t.string(e["name_stack"]), g.t.string(e["op"])
            for i, pats in enumerate(self.user_map):
                pat = pats[s]
                mod = module_path(pat, g.fw) if "*" not in pat and ":" not in pat else None
                if any(fnmatch.fnmatchcase(x, pat) for x in (ns, op, f"{ns}:{op}", u.label,
                                                             u.module)) or \
                        (mod and (u.module == mod or u.module.startswith(mod + "/"))):
                    out[k] = i
                    break
        return out

    def _module_id(self, s, module):
        if s == 0:
            return "m:" + self.module_map.get(module, "a:" + module)
        return "m:" + module if module in self._mapped_b else "b:" + module

    def _symbol(self, g, s, k, with_module):
        u = g.units[k]
        return (u.family, u.size, u.dtype, int(self.groups[s][k]),
                self._module_id(s, u.module) if with_module else "")

    def _pair_phase(self, phase):
        ga, gb = self.ga, self.gb
        classes = collections.OrderedDict()
        for g, s in ((ga, 0), (gb, 1)):
            for k, u in enumerate(g.units):
                if u.phase != phase or k in self.pair_of[s]:
                    continue
                sup = g.support[k]
                if not sup or any(x[0] == "l" for x in sup):
                    continue
                classes.setdefault(sup, ([], []))[s].append(k)
        bwd = phase == PHASE_BWD
        for sup, (la, lb) in sorted(classes.items(), key=lambda c: c[1][0][0] if c[1][0] else 1 << 62):
            if not la or not lb:
                continue
            n_atoms = sum(1 for x in sup if x[0] == "a")
            # the same symbol on both sides: the k-th from the end with the k-th from the end
            # (an init-time forward on the same inputs precedes the apply-time one)
            by_sym = collections.defaultdict(lambda: ([], []))
            for s, lst, g in ((0, la, ga), (1, lb, gb)):
                for k in lst:
                    by_sym[self._symbol(g, s, k, bwd)][s].append(k)
            for xs, ys in sorted(by_sym.values(), key=lambda v: v[0][0] if v[0] else 1 << 62):
                for ka, kb, score in self._assign(xs, ys):
                    self._add(ka, kb, "dataflow",
                              f"same op family and size, computed from the same {n_atoms} "
                              f"paired input(s) and parameter(s)" +
                              ("" if score is None else
                               f"; {score} of its direct inputs are the same values or made "
                               f"by paired ops"))
            # what is left: a composite on one side or both (LayerNorm's equations vs
            # aten::native_layer_norm), paired by its last unit
            left = collections.defaultdict(lambda: ([], []))
            for s, lst, g in ((0, la, ga), (1, lb, gb)):
                for k in lst:
                    if k not in self.pair_of[s]:
                        u = g.units[k]
                        left[(u.size, u.dtype, int(self.groups[s][k]),
                              self._module_id(s, u.module) if bwd else "")][s].append(k)
            for xs, ys in left.values():
                if xs and ys:
                    self._add(xs[-1], ys[-1], "dataflow (composite)",
                              f"the last of {len(xs)} op(s) of a and {len(ys)} of b computed "
                              f"from the same {n_atoms} paired input(s) and parameter(s)")

    # -- the forward: what the two sides compute ----------------------------------------
    def _pair_forward(self):
        """Forward units pair by what they compute, not by their op sequences. Inside each
        class (units computed from the same atoms), repeatedly:

        1. strict: units of the same symbol whose direct inputs pair (the same atoms,
           values made by paired units); a unit that reads an unpaired unit's value waits;
        2. values meet: where the two sides reach one value by different op sequences
           (Flax `(q/sqrt d) k^T` against torch's `(q k^T)/sqrt d`, a LayerNorm's equations
           against `native_layer_norm`), units of the same size whose outputs agree within
           tolerance pair, and what lies between them and the last pairs is one region;
        3. module output: where nothing inside meets (a port bug, fused against unfused
           attention), the last units of two corresponding modules pair, their region
           compared as one unit.

        Never two ops whose inputs do not pair: a pair made by 2 or 3 compares its region's
        inputs (`region_inputs`), and consumers pair strictly after it."""
        for _ in range(MAX_FORWARD_PASSES):
            before = len(self.pairs)
            for sup, (la, lb) in self._classes(PHASE_FWD):
                n_atoms = sum(1 for x in sup if x[0] == "a")
                while self._pair_strict(la, lb, n_atoms) or self._pair_meeting(la, lb, n_atoms) \
                        or self._pair_composite(la, lb, n_atoms) \
                        or self._pair_module_output(la, lb, n_atoms):
                    pass
            if len(self.pairs) == before:
                break

    def _classes(self, phase):
        """[(support, ([a units], [b units]))] of the units of one phase (paired ones too: the
        last pair of a class bounds what is left over), in the order of a's first unit;
        units that read a value only one side has are left out."""
        classes = collections.OrderedDict()
        for g, s in ((self.ga, 0), (self.gb, 1)):
            for k, u in enumerate(g.units):
                if u.phase != phase:
                    continue
                sup = g.support[k]
                if not sup or any(x[0] == "l" for x in sup):
                    continue
                classes.setdefault(sup, ([], []))[s].append(k)
        return [(sup, lists) for sup, lists in
                sorted(classes.items(), key=lambda c: c[1][0][0] if c[1][0] else 1 << 62)
                if lists[0] and lists[1]]

    def _pair_strict(self, la, lb, n_atoms):
        by_sym = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if k not in self.pair_of[s]:
                    by_sym[self._symbol(g, s, k, False)][s].append(k)
        new = False
        for xs, ys in by_sym.values():
            if not xs or not ys:
                continue
            keyed = ({}, {})
            for s, lst in ((0, xs), (1, ys)):
                for k in lst:
                    keys = self._complete_keys(s, k)
                    if keys is not None:
                        keyed[s].setdefault(keys, []).append(k)
            for keys, xl in keyed[0].items():
                # several with the same inputs: the k-th from the end with the k-th from the
                # end (an init-time forward on the same inputs precedes the apply-time one)
                for x, y in zip(reversed(xl), reversed(keyed[1].get(keys, []))):
                    self._add(x, y, "dataflow",
                              f"same op family and size, computed from the same {n_atoms} paired "
                              f"input(s) and parameter(s); its {len(keys)} direct input(s) are "
                              f"the same values or made by paired ops")
                    new = True
        return new

    def _pair_meeting(self, la, lb, n_atoms):
        """Step 2 of `_pair_forward`: the latest unpaired unit of a whose output agrees
        with an unpaired unit of b of the same size (latest first), within tolerance."""
        if self.agree is None:
            return False
        left = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if self.pair_key(s, k) is None:
                    u = g.units[k]
                    left[(u.size, int(self.groups[s][k]))][s].append(k)
        budget = MAX_MEET_COMPARISONS
        for xs, ys in left.values():
            for x in reversed(xs):
                ra = self.out_row(0, x)
                if ra is None or not comparable(ra):
                    continue
                for y in reversed(ys):
                    rb = self.out_row(1, y)
                    if rb is None or not comparable(rb):
                        continue
                    budget -= 1
                    if budget < 0:
                        return False
                    if self.agree(ra, rb):
                        na, nb = len(self.region(0, x)), len(self.region(1, y))
                        self._add(x, y, "dataflow (values meet)",
                                  f"the two sides reach this value by different ops ({na} of a, "
                                  f"{nb} of b since the last pairs): their outputs agree within "
                                  f"tolerance, computed from the same {n_atoms} paired input(s) "
                                  f"and parameter(s)")
                        return True
        return False

    def _pair_composite(self, la, lb, n_atoms):
        """Step 2b of `_pair_forward`, where no values meet (a difference inherited from
        earlier, or made here): the last unpaired unit of a with the last of b of the same
        size (a LayerNorm's equations against `native_layer_norm`, the scores `(q/sqrt d) k^T`
        against `(q k^T)/sqrt d`); values one side recomputes (`pair_key`) are not left over."""
        left = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            # only what follows the class's last pair: a unit before it was passed by the
            # other side's ops on the way to a value both reach (torch eager's unscaled scores)
            start = max((k for k in lst if k in self.pair_of[s]), default=-1)
            for k in lst:
                if k > start and self.pair_key(s, k) is None:
                    u = g.units[k]
                    left[(u.size, u.dtype, int(self.groups[s][k]))][s].append(k)
        for xs, ys in left.values():
            if xs and ys:
                self._add(xs[-1], ys[-1], "dataflow (composite)",
                          f"the last of {len(xs)} op(s) of a and {len(ys)} of b computed from the "
                          f"same {n_atoms} paired input(s) and parameter(s); their values do not "
                          f"meet")
                return True
        return False

    def _pair_module_output(self, la, lb, n_atoms):
        """Step 3 of `_pair_forward`: the last unpaired unit of a module on a with the last
        of its counterpart on b (the deepest module both end), sizes equal."""
        xs = [k for k in la if self.pair_key(0, k) is None]
        ys = [k for k in lb if self.pair_key(1, k) is None]
        ends_b = {y: self._module_ends(1, y) for y in ys}
        for x in reversed(xs):
            ux = self.ga.units[x]
            for ma in self._module_ends(0, x):
                mb = self.counterpart(ma)
                if mb is None:
                    continue
                y = next((y for y in reversed(ys) if mb in ends_b[y] and
                          self.gb.units[y].size == ux.size and
                          self.groups[1][y] == self.groups[0][x]), None)
                if y is None:
                    continue
                na, nb = len(self.region(0, x)), len(self.region(1, y))
                self._add(x, y, "module output",
                          f"the output of module {ma or '(top level)'!r} <-> "
                          f"{mb or '(top level)'!r}: nothing inside meets ({na} op(s) of a, "
                          f"{nb} of b since the last pairs), compared as one unit, computed "
                          f"from the same {n_atoms} paired input(s) and parameter(s)",
                          modules=(ma, mb))
                return True
        return False

    def _complete_keys(self, s, k):
        """What unit k reads directly, as a sorted tuple of ('a', atom) / ('p', pair), or
        None while it reads a value of an unpaired unit. 0-d values and constants add
        nothing."""
        g = self.ga if s == 0 else self.gb
        keys = []
        for _, _, nd in g.input_nodes(g.units[k]):
            row = g.nodes[nd][0]
            if row is not None and not len(g.shape(row)):
                continue
            a = self.atom(s, row)
            if a is not None:
                keys.append(("a", a))
                continue
            for v in self._producers(g, s, nd):
                pr = self.pair_key(s, v)
                if pr is not None:
                    keys.append(("p", pr))
                elif g.support[v]:
                    return None
        return tuple(sorted(set(keys)))

    def pair_key(self, s, k):
        """The pair index of unit k of side s, or of a paired unit of that side that computed
        the same value from the same atoms (Flax recomputes the attention mask's bias in
        every layer, torch computes it once); None."""
        pr = self.pair_of[s].get(k)
        if pr is not None:
            return pr
        g = self.ga if s == 0 else self.gb
        idx = self._same_value[s]
        if idx is None:
            idx = self._same_value[s] = collections.defaultdict(list)
            for j in range(len(g.units)):
                row = self.out_row(s, j)
                if row is not None and int(row["hash"]):
                    idx[(int(row["hash"]), int(row["dtype"]), int(row["shape"]))].append(j)
        row = self.out_row(s, k)
        if row is None or not int(row["hash"]):
            return None
        for j in idx.get((int(row["hash"]), int(row["dtype"]), int(row["shape"])), ()):
            pr = self.pair_of[s].get(j)
            if pr is not None and g.support[j] == g.support[k]:
                return pr
        return None

    def out_row(self, s, k):
        g = self.ga if s == 0 else self.gb
        return g.side.value_row(g.units[k].rep, 0)

    # -- modules ------------------------------------------------------------------------
    def unit_module(self, s, k):
        """The module path of a unit, without the name scopes that are not modules (jnp.einsum's
        '...qhd,...khd->...hqk')."""
        g = self.ga if s == 0 else self.gb
        return "/".join(c for c in g.units[k].module.split("/")
                        if c and "->" not in c and "," not in c)

    def _learn_modules(self, ma, mb):
        """Paired units in 'M/encoder/layer/0/attention/self/query' and
        'encoder/layer/0/attention/self/query': each ancestor pairs with the ancestor at the
        same distance from the common end ('M' with the top level)."""
        ca, cb = ma.split("/") if ma else [], mb.split("/") if mb else []
        n = 0
        while n < len(ca) and n < len(cb) and ca[-1 - n] == cb[-1 - n]:
            n += 1
        if not n and (ca or cb):
            return
        for i in range(n + 1):
            self._mod_pairs.setdefault("/".join(ca[:len(ca) - i]), "/".join(cb[:len(cb) - i]))

    def counterpart(self, ma):
        """b's module for a's module `ma`: learned from paired units, or its parent's
        counterpart with the same last name; None."""
        hit = self._mod_pairs.get(ma)
        if hit is not None:
            return hit
        if not ma:
            return None
        parent, _, last = ma.rpartition("/")
        up = self.counterpart(parent) if parent != ma else None
        if up is None:
            return None
        return f"{up}/{last}" if up else last

    def _module_ends(self, s, k):
        """The modules (deepest first) whose run of units ends at unit k of side s: the next
        forward unit of that side is outside them."""
        g = self.ga if s == 0 else self.gb
        m = self.unit_module(s, k)
        nxt = next((j for j in range(k + 1, len(g.units)) if g.units[j].phase == PHASE_FWD),
                   None)
        mn = self.unit_module(s, nxt) if nxt is not None else None
        out, cur = [], m
        while True:
            if mn is None or not (cur == "" or mn == cur or mn.startswith(cur + "/")):
                out.append(cur)
            if not cur:
                break
            cur = cur.rpartition("/")[0]
        return out

    MAX_SCORED = 10000

    def _assign(self, xs, ys):
        """[(a unit, b unit, score)] of one symbol in one class. Several candidates: the
        pairs whose direct inputs agree best (the same atoms, values made by paired units:
        a residual add, not the LayerNorm bias add beside it), ties going to the latest
        (an init-time forward precedes the apply-time one). One each: paired outright."""
        if len(xs) == 1 and len(ys) == 1:
            return [(xs[0], ys[0], None)]
        if len(xs) * len(ys) > self.MAX_SCORED:
            return [(x, y, None) for x, y in zip(reversed(xs), reversed(ys))]
        ka = [self._input_keys(0, x) for x in xs]
        kb = [self._input_keys(1, y) for y in ys]
        cands = []
        for i, x in enumerate(xs):
            for j, y in enumerate(ys):
                common = len(ka[i] & kb[j])
                score = common - len(ka[i] - kb[j]) - len(kb[j] - ka[i])
                cands.append((-score, -(i + j), -i, x, y, common))
        cands.sort()
        out, used_a, used_b = [], set(), set()
        for _, _, _, x, y, common in cands:
            if x not in used_a and y not in used_b:
                used_a.add(x)
                used_b.add(y)
                out.append((x, y, common))
        return sorted(out)

    def _input_keys(self, s, k):
        """What unit k reads directly: ('a', atom) for a value paired by value, ('p', pair)
        for a value made by a paired unit; unpaired producers and constants add nothing."""
        g = self.ga if s == 0 else self.gb
        keys = set()
        for _, _, nd in g.input_nodes(g.units[k]):
            a = self.atom(s, g.nodes[nd][0])
            if a is not None:
                keys.add(("a", a))
                continue
            for v in self._producers(g, s, nd):
                pr = self.pair_of[s].get(v)
                if pr is not None:
                    keys.add(("p", pr))
        return keys

    def _add(self, ka, kb, by, how, modules=None):
        ga_ = self.groups[0][ka]
        if ga_ >= 0:
            by, how = "user map", f"{how}; within the modules the map names " \
                                  f"({self.user_map[ga_][0]!r} -> {self.user_map[ga_][1]!r})"
        self.pair_of[0][ka] = len(self.pairs)
        self.pair_of[1][kb] = len(self.pairs)
        self.pairs.append(Pair(ka, kb, by, how, modules))
        self._learn_modules(self.unit_module(0, ka), self.unit_module(1, kb))

    def _module_map(self):
        out = {}
        for p in self.pairs:
            ma, mb = self.ga.units[p.a].module, self.gb.units[p.b].module
            out.setdefault(ma, mb)
        self._mapped_b = set(out.values())
        return out

    def _pair_user_leftovers(self):
        """Units of mapped modules that dataflow did not pair: by structure, in order from
        the end, never across op families."""
        for i in range(len(self.user_map)):
            la = [k for k in np.flatnonzero(self.groups[0] == i).tolist() if k not in self.pair_of[0]]
            lb = [k for k in np.flatnonzero(self.groups[1] == i).tolist() if k not in self.pair_of[1]]
            if not la or not lb:
                continue
            for phase in (PHASE_FWD, PHASE_BWD):
                pa = [k for k in la if self.ga.units[k].phase == phase]
                pb = [k for k in lb if self.gb.units[k].phase == phase]
                ids = {}
                sym_a = np.array([ids.setdefault((self.ga.units[k].family, self.ga.units[k].size),
                                                 len(ids)) for k in pa], np.uint64)
                sym_b = np.array([ids.setdefault((self.gb.units[k].family, self.gb.units[k].size),
                                                 len(ids)) for k in pb], np.uint64)
                if not len(sym_a) or not len(sym_b):
                    continue
                ia, ib, _ = _align.align_arrays(sym_a[::-1], sym_b[::-1])
                for x, y in zip((len(pa) - 1 - ia)[::-1].tolist(), (len(pb) - 1 - ib)[::-1].tolist()):
                    self.pair_of[0][pa[x]] = len(self.pairs)
                    self.pair_of[1][pb[y]] = len(self.pairs)
                    self.pairs.append(Pair(pa[x], pb[y], "user map",
                                           f"by structure (op family and size) within the "
                                           f"modules the map names ({self.user_map[i][0]!r} -> "
                                           f"{self.user_map[i][1]!r}); their inputs were not "
                                           f"paired by value"))

    # -- what a pair read -------------------------------------------------------------------
    def region(self, s, k, limit=64):
        """Unit k of side s and the unpaired units of its class that feed it (a composite
        on this side), in order."""
        g = self.ga if s == 0 else self.gb
        sup = g.support[k]
        out, stack = {k}, [k]
        while stack and len(out) < limit:
            u = stack.pop()
            for _, _, nd in g.input_nodes(g.units[u]):
                for v in self._producers(g, s, nd):
                    if v not in out and self.pair_key(s, v) is None and \
                            g.support[v] is not None and g.support[v] <= sup:
                        out.add(v)
                        stack.append(v)
        return sorted(out)

    def _producers(self, g, s, nd, depth=0):
        """Units a value node comes from, through byte-moving ops (stops at atoms)."""
        row, preds, term = g.nodes[nd]
        if self.atom(s, row) is not None or depth > 16:
            return []
        if term is not None:
            return [term[1]] if term[0] == "unit" else []
        out = []
        for q in preds:
            out += self._producers(g, s, q, depth + 1)
        return out

    def region_inputs(self, s, k):
        """[(consumer event, slot, row, key)] read by unit k's region from outside it; key:
        ('atom', id), ('pair', index) for a value made by a paired unit, or None."""
        g = self.ga if s == 0 else self.gb
        units = self.region(s, k)
        inside = set(units)
        out = []
        for v in units:
            for e, slot, nd in g.input_nodes(g.units[v]):
                row, preds, term = g.nodes[nd]
                if row is not None and not len(g.shape(row)):
                    continue          # 0-d: a scalar parameter of the op
                a = self.atom(s, row)
                if a is not None:
                    out.append((e, slot, row, ("atom", a)))
                    continue
                prods = self._producers(g, s, nd)
                if prods and all(p in inside for p in prods):
                    continue
                pk = [self.pair_key(s, p) for p in prods]
                key = ("pair", pk[0]) if len(pk) == 1 and pk[0] is not None else None
                out.append((e, slot, row, key))
        return out


def _union(parts):
    parts = [p for p in parts if p]
    if not parts:
        return frozenset()
    big = max(parts, key=len)
    if all(p <= big for p in parts):
        return big
    return frozenset().union(*parts)


def layer_text(unit, framework, family=None, label=None, module=None):
    """'Dense MLP/fc1 (dot_general + add)' for a unit of this framework; `family`: the
    pair's (a composite takes its kind from the single op on the other side); `module`: the
    module whose output a "module output" pair is ('module encoder/layer/0/attention/self
    (...)')."""
    if module is not None:
        return f"module {module or '(top level)'} ({label or unit.label})"
    family = family or unit.family
    kinds = LAYER_KIND.get(family)
    kind = ""
    if kinds:
        kind = kinds[0] if framework == schema.FW_JAX else kinds[1]
        if family == "conv" and framework != schema.FW_JAX and len(unit.shape) >= 3:
            kind = f"Conv{len(unit.shape) - 2}d"
    where = unit.module or "(top level)"
    return " ".join(x for x in (kind, where, f"({label or unit.label})") if x)
