"""The units of one side of a cross-framework comparison and how the values they read
came to be (`SideGraph`), with what pairing needs to know about ops and layouts: op
families across frameworks, the ops that only move bytes, composite library functions kept
whole, module paths, and the axis orders under which two arrays are one value.

`dataflow.py` pairs the units of two `SideGraph`s (see its docstring for the algorithm).
"""

import dataclasses
import itertools
import re

import numpy as np

from ...trace import schema
from ...trace.values import digest, parse_shape
from ..differ import comparable
from .nodes import ValueNodes


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
    "mkldnn_convolution": "conv", "convolution_backward": "conv",
    "native_layer_norm": "layer_norm", "layer_norm": "layer_norm",
    "embedding": "gather", "gather": "gather", "take": "gather", "index_select": "gather",
    "silu": "silu", "baddbmm": "linear", "addbmm": "linear", "cat": "concatenate",
    "concat": "concatenate",
    "native_batch_norm": "batch_norm", "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit": "batch_norm", "batch_norm": "batch_norm",
}
# inputs an op is handed but whose values its outputs do not depend on, by op and the
# parameter that makes them so: a batch norm in training mode normalises by the batch's own
# statistics and only writes the running ones (slots 3 and 4; its backward reads them too,
# unused). Read as inputs they put a value of one side into the support (torch updates its
# running statistics in place; a Flax program's `batch_stats` are another value after one
# step), and nothing after the first BatchNorm paired (HF ResNet trained in training mode).
UNREAD_SLOTS = {
    "native_batch_norm": ("training=True", (3, 4)),
    "_native_batch_norm_legit": ("training=True", (3, 4)),
    "_native_batch_norm_legit_functional": ("training=True", (3, 4)),
    "native_batch_norm_backward": ("train=True", (3, 4)),
}


def unread_slots(op, params):
    """The input slots of `op` (with its recorded `params`) whose values do not determine its
    outputs (`UNREAD_SLOTS`): empty for every other op."""
    name = (op[6:] if op.startswith("aten::") else op).split(".", 1)[0]
    rule = UNREAD_SLOTS.get(name)
    if rule is None or rule[0] not in params.split(", "):
        return ()
    return rule[1]


# jitted library functions that are one op in torch: kept as one unit
COMPOSITE = {"gelu": "gelu", "softmax": "softmax", "_softmax": "softmax",
             "log_softmax": "log_softmax", "_log_softmax": "log_softmax", "silu": "silu",
             "swish": "silu", "relu": "max", "sigmoid": "sigmoid", "logsumexp": "logsumexp",
             "standardize": "layer_norm", "_standardize": "layer_norm", "relu6": "relu6",
             "elu": "elu", "leaky_relu": "leaky_relu", "softplus": "softplus"}
KNOWN_FAMILIES = set(FAMILY.values()) | set(COMPOSITE.values())   # else a fused op's own name
# how each side calls a layer of this family (for findings: "Dense MLP/fc1 <-> Linear fc1")
LAYER_KIND = {"linear": ("Dense", "Linear"), "conv": ("Conv", "Conv"),
              "layer_norm": ("LayerNorm", "LayerNorm"), "gather": ("Embed", "Embedding"),
              "batch_norm": ("BatchNorm", "BatchNorm"), "gelu": ("gelu", "GELU"),
              "softmax": ("softmax", "softmax")}

PHASE_FWD, PHASE_BWD = 0, 1
MAX_PERM_DIMS = 5
GRADS_TAG = "tracediff:optax/grads/"


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
    'blocks/0'); a JAX einsum's spec ('...hqk,...khd->...qhd', the scope `jnp.einsum` pushes)
    is no module and is dropped."""
    if framework == schema.FW_JAX:
        s = re.sub(r"[A-Za-z_][\w]*\(", "", name_stack).replace(")", "")
        s = "/".join(c for c in s.split("/") if "->" not in c)
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
    # the frameworks' own layouts first: where dimensions of size 1 make several orders
    # give the same bytes (a 1x1 kernel [1, 1, 12, 4] against [4, 12, 1, 1] is both HWIO
    # <- OIHW and the reversal), the one found is a layout, not "converted wrongly"
    pref = [ident]
    if n == 2:
        pref.append((1, 0))
    if n >= 3:
        for c in ((0, n - 1) + tuple(range(1, n - 1)),        # NHWC <- NCHW
                  (n - 1, n - 2) + tuple(range(n - 2))):      # HWIO <- OIHW
            pref += [c, tuple(np.argsort(c).tolist())]
        pref.append(tuple(reversed(ident)))
    seen, out = set(), []
    for p in pref + list(itertools.permutations(ident)):
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def conventional(p):
    """Is axis order `p` (as `find_layout` returns it) a layout the frameworks use for one
    tensor: none, the 2-D (in, out) <-> (out, in) transpose, channels last <-> first, or a
    conv kernel HWIO <-> OIHW (either way round)? Any other order of a value both sides
    were given (a kernel with H and W swapped) is a porting error, not a layout."""
    p, n = tuple(int(i) for i in p), len(p)
    if p == tuple(range(n)) or (n == 2 and p == (1, 0)):
        return True
    if n < 3:
        return False
    kernel = (n - 1, n - 2) + tuple(range(n - 2))
    channels = (0, n - 1) + tuple(range(1, n - 1))
    return p in {q for c in (kernel, channels) for q in (c, tuple(np.argsort(c).tolist()))}


def broadcast_pair(sa, sb):
    """Does one of two shapes broadcast to the other (numpy's rules)?"""
    try:
        big = np.broadcast_shapes(tuple(sa), tuple(sb))
    except ValueError:
        return False
    return big in (tuple(sa), tuple(sb))


def broadcast_shapes_of(sa, sb):
    """(a's shape, b's shape) under which one of two arrays is the other's broadcast (numpy's
    rules): as they are, else with their dimensions of size 1 dropped (a reshape: torch's
    rotary cos [1, 1, 8, 8] against Flax's [2, 8, 1, 8], [8, 8] and [2, 8, 8]); None."""
    sa, sb = tuple(sa), tuple(sb)
    if broadcast_pair(sa, sb):
        return sa, sb
    qa, qb = tuple(d for d in sa if d != 1), tuple(d for d in sb if d != 1)
    if (qa, qb) != (sa, sb) and broadcast_pair(qa, qb):
        return qa, qb
    return None


def broadcasts_to(small, big):
    """Does an array of shape `small` broadcast to the larger shape `big`?"""
    return _size(small) < _size(big) and broadcast_pair(small, big)


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


class SideGraph(ValueNodes):
    """One side of the comparison: its units and how the values they read came to be (the
    value nodes: `nodes.py`)."""

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
        self._by_parent = None
        self.units, self.unit_of = self._units()
        self._kid_by_hash = {}
        self._inputs = {}       # unit rep -> input_nodes()
        self.nodes = {}         # value node -> (row, preds, term)
        self.support = [None] * len(self.units)

    # -- units ------------------------------------------------------------------------------
    def op(self, e):
        return self.t.string(self.t.events["op"][e])

    def unread_slots(self, e):
        """Input slots of event e its outputs do not depend on (`unread_slots`)."""
        if self.fw != schema.FW_TORCH:
            return ()
        return unread_slots(self.op(e), self.t.string(self.t.events["params"][e]))

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
            if fam is None or first[e] < 0 or self.copied_input(e) is not None:
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
        # a matmul or conv followed by the bias add that reads it: one layer (never JAX's
        # `add_any`: the backward summing a gradient's terms, not a bias; never a residual
        # add after a layer without bias, Llama's `h + o_proj(x)`: a bias is broadcast)
        merged, i = [], 0
        while i < len(out):
            u = out[i]
            if u.family in ("matmul", "conv") and i + 1 < len(out) and \
                    out[i + 1].family == "add" and out[i + 1].label != "add_any":
                nxt = out[i + 1]
                prods = {int(r["producer"]) for r in t.input_rows(nxt.rep)}
                if u.rep in prods and nxt.size == u.size and \
                        any(self._broadcast_operand(p, nxt.size) for p in prods - {u.rep}):
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

    def _broadcast_operand(self, e, size, depth=0):
        """Was event e's value broadcast from a smaller one (followed back through
        byte-moving ops)? A bias `[n]` added to a layer's `[..., n]` output is; a residual
        (the layer's input, or a value computed) of the output's size is not."""
        if not 0 <= e < self.n or not self.mask[e] or depth > 16:
            return False
        row = self.side.value_row(e, 0)
        if row is not None and _size(self.shape(row)) < size:
            return True
        kind = int(self.kind[e])
        if self.fam_of.get(int(self.t.events["op"][e])) is not None or \
                kind == schema.KIND_CALL or (kind == schema.KIND_EQN and self.has_kids[e]):
            return False
        return any(self._broadcast_operand(int(r["producer"]), size, depth + 1)
                   for r in self.t.input_rows(e))

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
