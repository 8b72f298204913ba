"""Re-execute one recorded op on this machine, from a trace's recorded inputs.

Honest by construction:

* Only ops on an explicit allow-list are ever run (`TORCH_OPS`: aten operator names,
  looked up as `torch.ops.aten.<name>.<overload>`; `JAX_PRIMITIVES`: `jax.lax` primitive
  names, looked up as `jax.extend.core.primitives.<name>_p`). Nothing from a trace is
  evaluated, unpickled or imported by name.
* The op's non-array parameters come from the event's `params` summary, parsed with
  `ast.parse` (which never executes anything) and accepted only when every value is a
  literal (numbers, strings, None, booleans, tuples/lists of those) or one of a few
  named constants mapped here (`dtype('float32')`, `torch.float32`,
  `torch.contiguous_format`, `device(type='cpu')`, `Precision.HIGHEST`,
  `ConvDimensionNumbers(lhs_spec=(..), rhs_spec=(..), out_spec=(..))` of int tuples, built
  as `jax.lax.ConvDimensionNumbers`). A summary that was shortened at recording time
  ("..."; or, in a trace of an older tracediff that cut values in the middle, a summary
  of 240 characters or a value of 60 that does not parse) gives "parameters were
  shortened when recorded"; one that holds anything else gives "cannot replay: parameters not
  recorded in a form that can rebuild the call" (`CannotReplay`).
* Array inputs are the producer values of the event's rows in the `inputs` table. A
  literal constant of a jaxpr (producer -2) or a value that was not stored cannot be
  rebuilt: the op is then not replayed, and the reason says so.

`OpCall.run(inputs, upcast=False)` runs the op in its recorded dtypes; `upcast=True`
runs it with floating inputs (and dtype parameters) promoted to float64 / complex128:
the oracle for float16/bfloat16/float32 ops. For ops that are already float64 the
oracle is numpy in `np.longdouble` (x87 80-bit on x86-64) for the ops in
`_NUMPY_ORACLE` only; otherwise there is no oracle and the verdict says so.

Bounded by what the trace holds (its parameters are untrusted: `expand` with a recorded
`size=[250000000, 4]` asks for 4 GB from a scalar): before an op runs, `OpCall.run` (and
`check_size`, for the reproducer) computes the shapes and dtypes of its outputs without
running it (torch: the op on `meta` tensors; JAX: `jax.eval_shape`), and refuses
(`ReplayRefused`, a `CannotReplay` whose message starts with "replay refused: ") when they
would hold more elements than the op's recorded outputs (`OpCall.recorded`: the shapes of
its output rows in the values table, stored or not, `recorded_output_size`) or take more
than `MAX_OUTPUT_BYTES` (256 MiB). Elements, not bytes, are compared with the recording so
that a replay in a wider dtype than recorded is still run (and found not to reproduce);
the cap is in bytes and holds for the float64 oracle run (`upcast=True`) too. When the
sizes cannot be computed without running the op, it is not run either. (The long-double
numpy oracle of float64 ops produces the same shape as the checked op, at twice its
bytes; inputs are capped by the caller, 64 MB in `explain`.)
"""

import ast
import math
import re

import numpy as np

from ...trace import schema
from ...trace import values as _values
from .convolution import TORCH_CONVS

MAX_OUTPUT_BYTES = 256 << 20   # what one replay run may produce, whatever was recorded


class CannotReplay(Exception):
    """The op cannot be rebuilt from what the trace holds (the message says why)."""


class Named(tuple):
    """(kind, name) of an allow-listed named constant (`torch.float32`, `dtype('float32')`,
    `Precision.HIGHEST`, `device(type='cpu')`; for `ConvDimensionNumbers(...)` the kind
    "conv_dims" and as name its three int tuples), distinct from a literal tuple in the params:
    a recorded `('torch_dtype', 'float32 if ... else 0')` must stay a tuple of strings, never
    become code in a reproducer or an attribute looked up here."""

    def __new__(cls, kind, name):
        return super().__new__(cls, (kind, name))


class ReplayRefused(CannotReplay):
    """The op would produce more than the trace recorded for it (or than the cap)."""


def _human(n):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def recorded_output_size(trace, event):
    """(elements, bytes) of the recorded outputs of `event`: the shapes x storage dtypes
    of its output rows, stored or not; None when it has no output rows."""
    rows = trace.value_rows(int(event), schema.ROLE_OUT)
    if not len(rows):
        return None
    elements = nbytes = 0
    for r in rows:
        storage = trace.string(r["storage"])
        itemsize = np.dtype(storage).itemsize if storage in _values._NATIVE else 0
        try:
            dims = _values.parse_shape(trace.string(r["shape"]), 64)
        except ValueError:
            return (0, 0)
        count = 1
        for d in dims:
            count *= d
        elements += count
        nbytes += count * itemsize
    return (elements, nbytes)


# -- allow-lists --------------------------------------------------------------------------

TORCH_OPS = frozenset("""
dot vdot mm addmm bmm baddbmm addbmm matmul mv addmv addr outer linear einsum tensordot
add sub rsub mul div neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal pow
square tanh sigmoid sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh erf erfc
erfinv relu gelu silu elu leaky_relu softplus hardtanh logit _softmax softmax _log_softmax
log_softmax sum mean prod var std norm linalg_vector_norm amax amin max min maximum minimum
clamp clamp_min clamp_max where lerp addcmul addcdiv floor ceil round trunc frac sign
cumsum cumprod logsumexp mse_loss l1_loss smooth_l1_loss binary_cross_entropy
nll_loss_forward _log_softmax_backward_data _softmax_backward_data tanh_backward
sigmoid_backward threshold_backward gelu_backward silu_backward mse_loss_backward
t transpose permute reshape view _unsafe_view expand clone contiguous _to_copy squeeze
unsqueeze cat stack select slice index_select gather sqrt mul_ add_ sub_ div_ lerp_
addcmul_ addcdiv_ mean sum linalg_matrix_exp matrix_exp linalg_solve linalg_inv
native_layer_norm layer_norm var_mean
convolution _convolution conv1d conv2d conv3d
""".split())

JAX_PRIMITIVES = frozenset("""
abs acos acosh add asin asinh atan atan2 atanh cbrt ceil clamp complex conj convert_element_type
cos cosh cumsum cumprod cumlogsumexp cummax cummin digamma div dot_general erf erf_inv erfc exp
exp2 expm1 floor imag integer_pow is_finite lgamma log log1p logistic max min mul neg nextafter
pow real reduce_max reduce_min reduce_prod reduce_sum rem round rsqrt select_n sign sin sinh
sqrt square sub tan tanh transpose reshape broadcast_in_dim squeeze rev slice concatenate pad
copy conv_general_dilated
""".split())

# named constants accepted in a params summary, mapped to what the framework needs
_TORCH_CONSTANTS = {
    **{n: ("torch_dtype", n) for n in (
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16",
        "int32", "int64", "uint8", "bool", "half", "float", "double", "long", "int")},
    **{n: ("torch_memfmt", n) for n in (
        "contiguous_format", "preserve_format", "channels_last", "channels_last_3d")},
}
_NUMPY_DTYPES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8",
                 "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"}
_PRECISIONS = {"DEFAULT", "HIGH", "HIGHEST"}
_UPCAST = {"float16": "float64", "bfloat16": "float64", "float32": "float64",
           "complex64": "complex128", "half": "double", "float": "double"}
_HIGH = {"float64", "complex128"}


# -- the params summary -------------------------------------------------------------------

def _lit(node):
    """A literal or allow-listed constant from an ast node; raises CannotReplay."""
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise CannotReplay("parameters were shortened when recorded (...)")
        if isinstance(node.value, (int, float, complex, str, bool, type(None))):
            return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _lit(node.operand)
        if isinstance(v, (int, float, complex)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [_lit(e) for e in node.elts]
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner, attr = node.value.id, node.attr
        if owner == "torch" and attr in _TORCH_CONSTANTS:
            return Named(*_TORCH_CONSTANTS[attr])
        if owner == "Precision" and attr in _PRECISIONS:
            return Named("precision", attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
            and node.func.id == "device" and len(node.keywords) == 1 \
            and node.keywords[0].arg == "type":
        _lit(node.keywords[0].value)
        return Named("device", "cpu")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
            and node.func.id == "ConvDimensionNumbers":
        return _conv_dims(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 \
            and not node.keywords:
        fn = node.func.id
        if fn == "dtype":
            name = _lit(node.args[0])
            if name in _NUMPY_DTYPES:
                return Named("np_dtype", name)
        if fn in ("np.int64", "int64"):  # pragma: no cover - handled below
            pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "np" and \
            node.func.attr in ("int64", "int32", "float64", "float32") and \
            len(node.args) == 1 and not node.keywords:
        v = _lit(node.args[0])   # numpy scalar reprs: np.int64(0)
        if isinstance(v, (int, float)):
            return v
    raise CannotReplay(f"parameter value {ast.unparse(node)[:60]!r} is not a plain literal")


_CONV_SPECS = ("lhs_spec", "rhs_spec", "out_spec")


def _conv_dims(node):
    """`ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(..), out_spec=(..))`, each
    spec a permutation of the same rank: Named("conv_dims", (lhs, rhs, out))."""
    given = {kw.arg: _lit(kw.value) for kw in node.keywords}
    specs = tuple(given.get(k) for k in _CONV_SPECS)
    ok = set(given) == set(_CONV_SPECS) and all(
        isinstance(sp, tuple) and all(isinstance(d, int) and not isinstance(d, bool)
                                      for d in sp) and sorted(sp) == list(range(len(sp)))
        for sp in specs) and len({len(sp) for sp in specs}) == 1
    if not ok:
        raise CannotReplay(f"parameter value {ast.unparse(node)[:60]!r} is not a convolution's "
                           f"dimension numbers")
    return Named("conv_dims", specs)


# a summary written by a tracediff that cut values at 60 characters and the whole at 240
_OLD_VALUE_CUT, _OLD_CUT = 60, 240
_VALUE_START = re.compile(r"(?:^|, )[A-Za-z_][A-Za-z0-9_]*=")


def _cut_in_the_middle(text):
    """An unparseable summary that an older tracediff cut in the middle: 240 characters,
    or a value of exactly 60."""
    if len(text) == _OLD_CUT:
        return True
    found = list(_VALUE_START.finditer(text))
    starts = {m.start() for m in found} | {len(text)}
    return any(m.end() + _OLD_VALUE_CUT in starts for m in found)


_POS_KEY = re.compile(r"(^|, )(\d+)=")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")   # ASCII names only (`**x` has no name)


def parse_params(text):
    """{name: value} from a recorded params summary (`key=repr, ...`); raises
    CannotReplay when it cannot be read back exactly."""
    text = (text or "").strip()
    if not text:
        return {}
    if text.endswith("..."):
        raise CannotReplay("parameters were shortened when recorded (...)")
    src = _POS_KEY.sub(lambda m: f"{m.group(1)}_pos{m.group(2)}=", text)
    try:
        tree = ast.parse(f"f({src})", mode="eval")
    except SyntaxError:
        if _cut_in_the_middle(text):
            raise CannotReplay("parameters were shortened when recorded (cut at "
                               f"{_OLD_VALUE_CUT} characters a value, {_OLD_CUT} in all, by an "
                               "older tracediff)") from None
        raise CannotReplay("parameters not recorded in a form that can rebuild the call") from None
    call = tree.body
    if not isinstance(call, ast.Call) or call.args or \
            not all(kw.arg and _KEY.fullmatch(kw.arg) for kw in call.keywords):
        raise CannotReplay("parameters not recorded in a form that can rebuild the call")
    return {kw.arg: _lit(kw.value) for kw in call.keywords}


# -- values -------------------------------------------------------------------------------

def upcast_dtype(name):
    return _UPCAST.get(name, name)


def is_float_name(name):
    return name.startswith(("float", "bfloat", "complex"))


def _np_upcast(x):
    x = np.asarray(x)
    name = x.dtype.name
    if name in _UPCAST:
        return x.astype(_UPCAST[name])
    return x


def _to_torch(torch, x):
    x = np.asarray(x)
    x = np.ascontiguousarray(x).reshape(x.shape)   # ascontiguousarray makes 0-d 1-d
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _from_torch(torch, t):
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


# -- op calls -----------------------------------------------------------------------------

class OpCall:
    """A rebuilt call of one recorded op: `run(inputs, upcast)` -> list of numpy outputs."""

    framework = ""
    recorded = None   # (elements, bytes) of the recorded outputs; None: unknown, only the cap

    def __init__(self, op, params):
        self.op, self.params = op, params

    def run(self, inputs, upcast=False):
        self.check_size(inputs, upcast)
        return self._run(inputs, upcast)

    def _run(self, inputs, upcast):  # pragma: no cover - interface
        raise NotImplementedError

    def output_sizes(self, inputs, upcast=False):  # pragma: no cover - interface
        """[(elements, bytes)] of the outputs, computed without running the op."""
        raise NotImplementedError

    def check_size(self, inputs, upcast=False):
        """Raise `ReplayRefused` unless the outputs fit the budget (module docstring)."""
        try:
            sizes = self.output_sizes(inputs, upcast)
        except CannotReplay:
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
            raise ReplayRefused(f"replay refused: the size of its output cannot be computed "
                                f"without running it ({type(exc).__name__}: {first})") from None
        elements = sum(e for e, _ in sizes)
        total = sum(b for _, b in sizes)
        if self.recorded is not None and elements > self.recorded[0]:
            rec_e, rec_b = self.recorded
            raise ReplayRefused(f"replay refused: the op would output {elements:,} elements "
                                f"({_human(total)}), more than its recorded outputs "
                                f"({rec_e:,} element{'' if rec_e == 1 else 's'}, {_human(rec_b)})")
        if total > MAX_OUTPUT_BYTES:
            raise ReplayRefused(f"replay refused: the op would output {elements:,} elements "
                                f"({_human(total)}{', in float64' if upcast else ''}), more "
                                f"than the {MAX_OUTPUT_BYTES >> 20} MiB a replay may produce")

    def describe(self):
        return self.op


class TorchCall(OpCall):
    framework = "torch"

    def __init__(self, op, params, n_inputs):
        super().__init__(op, params)
        import torch

        m = re.fullmatch(r"aten::([a-z_][a-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?", op)
        if not m:
            raise CannotReplay(f"{op!r} is not an aten operator name")
        name, overload = m.group(1), m.group(2) or "default"
        if name not in TORCH_OPS:
            raise CannotReplay(f"{op} is not on the list of ops tracediff replays")
        packet = getattr(torch.ops.aten, name)
        if overload not in packet.overloads():
            raise CannotReplay(f"{op}: this torch has no overload {overload!r}")
        self.name, self.overload = name, overload
        self.fn = getattr(packet, overload)
        self.plan = self._plan(self.fn._schema, params, n_inputs)

    @staticmethod
    def _plan(sch, params, n_inputs):
        """[(arg name, ('tensor', i) | ('tensors', i, j) | ('value', v), kwarg_only)]."""
        args = list(sch.arguments)
        tensor_args = []
        for a in args:
            ty = str(a.type)
            if a.name in params:
                continue
            # schema types read `Tensor?` / `Tensor[]` or `Optional[Tensor]` / `List[Tensor]`
            # depending on the torch version
            if (ty.startswith("Tensor") and "[]" in ty) or ty.startswith("List[Tensor") or \
                    ty.startswith("List[Optional[Tensor"):
                tensor_args.append((a.name, "list"))
            elif (ty.startswith("Tensor") and ty.rstrip("!)").endswith("?")) or \
                    ty.startswith("Optional[Tensor"):
                tensor_args.append((a.name, "optional"))
            elif ty.startswith("Tensor"):
                tensor_args.append((a.name, "required"))
        required = sum(1 for _, k in tensor_args if k == "required")
        n_lists = sum(1 for _, k in tensor_args if k == "list")
        if n_lists > 1:
            raise CannotReplay("more than one tensor-list argument: cannot tell which input "
                               "goes where")
        spare = n_inputs - required
        if spare < 0:
            raise CannotReplay(f"{n_inputs} tensor inputs recorded, the schema needs {required}")
        optional = sum(1 for _, k in tensor_args if k == "optional")
        if n_lists and optional and spare:
            raise CannotReplay("optional tensors next to a tensor list: ambiguous inputs")
        plan, i = {}, 0
        for name, kind in tensor_args:
            if kind == "required":
                plan[name] = ("tensor", i)
                i += 1
            elif kind == "optional":
                if spare > 0:
                    plan[name] = ("tensor", i)
                    i += 1
                    spare -= 1
            else:
                plan[name] = ("tensors", i, i + spare)
                i += spare
                spare = 0
        if spare:
            raise CannotReplay(f"{n_inputs} tensor inputs recorded but the schema of {sch.name} "
                               f"takes fewer")
        known = {a.name for a in args}
        for k, v in params.items():
            pos = re.fullmatch(r"_pos(\d+)", k)
            if pos:
                pos = int(pos.group(1))
                if pos >= len(args):
                    raise CannotReplay(f"positional parameter {pos} is beyond the schema")
                k = args[pos].name
            if k not in known:
                raise CannotReplay(f"parameter {k!r} is not in the schema of {sch.name}")
            plan[k] = ("value", v)
        return plan

    def _value(self, torch, v, upcast, meta=False):
        if isinstance(v, Named):
            kind, name = v
            if kind == "torch_dtype":
                return getattr(torch, upcast_dtype(name) if upcast else name)
            if kind == "torch_memfmt":
                return getattr(torch, name)
            if kind == "device":
                return torch.device("meta" if meta else "cpu")
            if kind == "np_dtype":
                return getattr(torch, upcast_dtype(name) if upcast else name)
            raise CannotReplay(f"{kind} parameters do not apply to torch ops")
        if isinstance(v, (list, tuple)):
            return type(v)(self._value(torch, x, upcast, meta) for x in v)
        return v

    def _kwargs(self, torch, ts, upcast, meta=False):
        kwargs = {}
        for name, how in self.plan.items():
            if how[0] == "tensor":
                kwargs[name] = ts[how[1]]
            elif how[0] == "tensors":
                kwargs[name] = ts[how[1]:how[2]]
            else:
                kwargs[name] = self._value(torch, how[1], upcast, meta)
        return kwargs

    def output_sizes(self, inputs, upcast=False):
        """The op on `meta` tensors (shapes and dtypes only, no data, nothing allocated)."""
        import torch

        ts = []
        for x in inputs:
            x = np.asarray(x)
            dt = np.dtype(_UPCAST[x.dtype.name]) if upcast and x.dtype.name in _UPCAST else x.dtype
            tdt = torch.bfloat16 if dt.name == "bfloat16" else torch.from_numpy(np.empty(0, dt)).dtype
            ts.append(torch.empty(x.shape, dtype=tdt, device="meta"))
        with torch.no_grad():
            out = self.fn(**self._kwargs(torch, ts, upcast, meta=True))
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [(o.numel(), o.numel() * o.element_size()) if isinstance(o, torch.Tensor)
                else (1, 16) for o in outs]

    def _run(self, inputs, upcast):
        import torch

        ts = [_to_torch(torch, _np_upcast(x) if upcast else x) for x in inputs]
        kwargs = self._kwargs(torch, ts, upcast)
        with torch.no_grad():
            out = self.fn(**kwargs)
        if isinstance(out, torch.Tensor):
            return [_from_torch(torch, out)]
        if isinstance(out, (list, tuple)):
            return [_from_torch(torch, o) for o in out if isinstance(o, torch.Tensor)]
        return [np.asarray(out)]

    def code(self):
        """Python source lines that rebuild the call (for the reproducer)."""
        args = []
        for name, how in self.plan.items():
            if how[0] == "tensor":
                args.append(f"{name}=inputs[{how[1]}]")
            elif how[0] == "tensors":
                args.append(f"{name}=inputs[{how[1]}:{how[2]}]")
            else:
                args.append(f"{name}={_py(how[1], 'torch')}")
        return f"torch.ops.aten.{self.name}.{self.overload}({', '.join(args)})"


class JaxCall(OpCall):
    framework = "jax"

    def __init__(self, op, params, n_inputs):
        super().__init__(op, params)
        if op not in JAX_PRIMITIVES:
            if op.startswith("jit:"):
                raise CannotReplay(f"{op} is a nested jit, not one primitive: its equations "
                                   f"are compared one by one")
            raise CannotReplay(f"{op} is not on the list of primitives tracediff replays")
        from jax.extend.core import primitives

        self.prim = getattr(primitives, f"{op}_p", None)
        if self.prim is None:
            raise CannotReplay(f"this jax has no primitive {op!r}")
        self.n_inputs = n_inputs

    def _value(self, v, upcast):
        if isinstance(v, Named):
            kind, name = v
            if kind == "np_dtype":
                import ml_dtypes  # noqa: F401  (bfloat16 needs it registered)

                n = upcast_dtype(name) if upcast else name
                return np.dtype(getattr(ml_dtypes, n)) if n == "bfloat16" else np.dtype(n)
            if kind == "precision":
                from jax import lax

                return lax.Precision[name]
            if kind == "conv_dims":
                from jax import lax

                return lax.ConvDimensionNumbers(*name)
            raise CannotReplay(f"{kind} parameters do not apply to jax primitives")
        if isinstance(v, list):
            return tuple(self._value(x, upcast) for x in v)
        if isinstance(v, tuple):
            return tuple(self._value(x, upcast) for x in v)
        return v

    def output_sizes(self, inputs, upcast=False):
        """`jax.eval_shape` of the primitive: shapes and dtypes only, nothing computed."""
        import jax

        params = {k: self._value(v, upcast) for k, v in self.params.items()}
        specs = []
        for x in inputs:
            x = np.asarray(x)
            dt = np.dtype(_UPCAST[x.dtype.name]) if upcast and x.dtype.name in _UPCAST else x.dtype
            specs.append(jax.ShapeDtypeStruct(x.shape, dt))
        with x64(jax):
            out = jax.eval_shape(lambda *xs: self.prim.bind(*xs, **params), *specs)
        outs = out if self.prim.multiple_results else [out]
        sizes = []
        for o in outs:
            n = 1
            for d in o.shape:
                n *= int(d)
            sizes.append((n, n * np.dtype(o.dtype).itemsize))
        return sizes

    def _run(self, inputs, upcast):
        import jax

        params = {k: self._value(v, upcast) for k, v in self.params.items()}
        xs = [_np_upcast(x) if upcast else np.asarray(x) for x in inputs]
        with x64(jax):
            out = self.prim.bind(*xs, **params)
            outs = out if self.prim.multiple_results else [out]
            return [np.asarray(o) for o in outs]

    def code(self):
        params = ", ".join(f"{k}={_py(v, 'jax')}" for k, v in self.params.items())
        return f"primitives.{self.op}_p.bind(*inputs{', ' + params if params else ''})"


def x64(jax):
    """The context manager that enables float64 in `jax` for a block: `jax.enable_x64`
    (JAX >= 0.8), `jax.experimental.enable_x64` before it (JAX 0.7)."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


_NAMES = {"np_dtype": _NUMPY_DTYPES, "precision": _PRECISIONS,
          "torch_dtype": {k for k, v in _TORCH_CONSTANTS.items() if v[0] == "torch_dtype"},
          "torch_memfmt": {k for k, v in _TORCH_CONSTANTS.items() if v[0] == "torch_memfmt"}}


def _py(v, fw):
    """Python source of a parsed parameter value (for the generated reproducer): literals
    as their repr, named constants only from the allow-lists above."""
    if isinstance(v, Named):
        kind, name = v
        if kind == "device":
            return "torch.device('cpu')"
        if kind == "conv_dims" and fw == "jax":
            lhs, rhs, out = (_py(tuple(int(d) for d in sp), fw) for sp in name)
            return f"lax.ConvDimensionNumbers(lhs_spec={lhs}, rhs_spec={rhs}, out_spec={out})"
        if name not in _NAMES.get(kind, ()):   # never: parse_params makes only these
            raise CannotReplay(f"{kind} {name!r} is not an allow-listed constant")
        if kind == "np_dtype":
            return f"torch.{name}" if fw == "torch" else f"np.dtype({name!r})"
        if kind == "precision":
            return f"lax.Precision.{name}"
        return f"torch.{name}"
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, complex):
        return f"complex({_py(v.real, fw)}, {_py(v.imag, fw)})"
    if isinstance(v, tuple):
        return "(" + ", ".join(_py(x, fw) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, list):
        return ("(" if fw == "jax" else "[") + ", ".join(_py(x, fw) for x in v) + \
            ("," if fw == "jax" and len(v) == 1 else "") + (")" if fw == "jax" else "]")
    raise CannotReplay(f"a {type(v).__name__} parameter cannot be written as code")


def build_call(framework, op, params_text, n_inputs, recorded=None):
    """An `OpCall` for a recorded op, or raises CannotReplay with the reason.
    `recorded`: (elements, bytes) of its recorded outputs (`recorded_output_size`), the
    most its replay may produce (besides `MAX_OUTPUT_BYTES`)."""
    call = _build_call(framework, op, params_text, n_inputs)
    call.recorded = recorded
    return call


def _torch_conv_without_bias(op, params, n_inputs):
    """A torch convolution recorded with two tensors (input, weight) and no bias in its
    params: its bias was None, which the recording leaves out (the schema still needs it)."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    return name in TORCH_CONVS and n_inputs == 2 and "bias" not in params and \
        "_pos2" not in params


def _build_call(framework, op, params_text, n_inputs):
    if framework == "jax" and op not in JAX_PRIMITIVES:
        JaxCall(op, {}, n_inputs)   # raises CannotReplay with the reason
    if framework == "torch" and op.split("::", 1)[-1].split(".", 1)[0] not in TORCH_OPS:
        raise CannotReplay(f"{op} is not on the list of ops tracediff replays")
    params = parse_params(params_text)
    if framework == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise CannotReplay("torch is not installed here") from None
        if _torch_conv_without_bias(op, params, n_inputs):
            params["bias"] = None
        return TorchCall(op, params, n_inputs)
    if framework == "jax":
        try:
            import jax  # noqa: F401
        except ImportError:
            raise CannotReplay("jax is not installed here") from None
        return JaxCall(op, params, n_inputs)
    raise CannotReplay(f"unknown framework {framework!r}")


# -- numpy extended-precision oracle (for float64 ops) ------------------------------------

def _dot_general_np(x, y, dimension_numbers=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    if lb or rb:
        raise CannotReplay("batched dot_general has no numpy oracle")
    return np.tensordot(x, y, axes=(tuple(lc), tuple(rc)))


def _logistic(x, **_):
    return 1 / (1 + np.exp(-x))


_UNARY = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos,
          "tan": np.tan, "sqrt": np.sqrt, "expm1": np.expm1, "log1p": np.log1p, "neg": np.negative,
          "abs": np.abs, "sinh": np.sinh, "cosh": np.cosh, "arcsinh": np.arcsinh,
          "asinh": np.arcsinh, "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos,
          "rsqrt": lambda x: 1 / np.sqrt(x), "square": np.square, "sigmoid": None,
          "logistic": None, "exp2": np.exp2, "reciprocal": lambda x: 1 / x}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "atan2": np.arctan2, "max": np.maximum, "min": np.minimum,
           "maximum": np.maximum, "minimum": np.minimum}


def numpy_oracle(framework, op, params, inputs):
    """The op evaluated by numpy in long double (complex: clongdouble), or None when
    there is no numpy equivalent here (or long double is no wider than float64)."""
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        return None
    name = op.split("::", 1)[-1].split(".", 1)[0] if framework == "torch" else op

    def wide(x):
        x = np.asarray(x)
        if x.dtype.kind == "c":
            return x.astype(np.clongdouble)
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            return x.astype(np.longdouble)
        return x

    xs = [wide(x) for x in inputs]
    try:
        with np.errstate(all="ignore"):
            if name in ("logistic", "sigmoid") and len(xs) == 1:
                return [_logistic(xs[0])]
            if name in _UNARY and _UNARY[name] is not None and len(xs) == 1:
                return [_UNARY[name](xs[0])]
            if name in _BINARY and len(xs) == 2 and not params.get("alpha", 1) != 1:
                return [_BINARY[name](xs[0], xs[1])]
            if framework == "jax" and name == "dot_general" and len(xs) == 2:
                return [_dot_general_np(*xs, **params)]
            if framework == "torch" and name in ("dot", "mm", "matmul", "mv", "bmm") and len(xs) == 2:
                return [np.matmul(xs[0], xs[1])]
            if framework == "torch" and name == "addmm" and len(xs) == 3:
                return [params.get("beta", 1) * xs[0] + params.get("alpha", 1) *
                        np.matmul(xs[1], xs[2])]
    except (CannotReplay, TypeError, ValueError):
        return None
    return None


def oracle_of_kind(dtype_name):
    """How the oracle of an op with outputs in this dtype is computed."""
    if dtype_name in _HIGH:
        return "longdouble"
    return "float64"


def kinds():
    return schema.KIND_NAMES
