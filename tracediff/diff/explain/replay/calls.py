"""One recorded op rebuilt as a call on this machine (`build_call` -> `OpCall`) and run.

Only ops on the allow-lists run (`TORCH_OPS`: aten names looked up as
`torch.ops.aten.<name>.<overload>`; `JAX_PRIMITIVES`: `jax.extend.core.primitives.<name>_p`),
with the parameters `params.py` read back. `OpCall.run` first computes the shapes of the
outputs without running the op (torch's `meta` tensors, `jax.eval_shape`) and refuses
(`ReplayRefused`) more elements than were recorded or more than `MAX_OUTPUT_BYTES`;
`upcast=True` runs it in float64 / complex128, the oracle of narrower ops.
"""

import re

import numpy as np

from ....trace import schema
from ....trace import values as _values
from ..convolution import TORCH_CONVS
from .params import CannotReplay, Named, _py, parse_params

MAX_OUTPUT_BYTES = 256 << 20   # what one replay run may produce, whatever was recorded


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

_UPCAST = {"float16": "float64", "bfloat16": "float64", "float32": "float64",
           "complex64": "complex128", "half": "double", "float": "double"}


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


def kinds():
    return schema.KIND_NAMES
