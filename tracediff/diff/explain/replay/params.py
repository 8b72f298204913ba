"""The recorded params summary of an op (`key=repr, ...`), read back and written out.

A trace's params are untrusted text: `parse_params` reads them with `ast.parse` (which
never executes anything) and accepts only literals and a few allow-listed named constants
(`Named`: dtypes, memory formats, `Precision.*`, `device(type=...)`, a convolution's
dimension numbers); anything else, or a summary shortened at recording time, is
`CannotReplay` with the reason. `_py` writes a parsed value back as Python source for the
reproducer, from the same allow-lists. `CannotReplay` lives here because reading the
parameters is the first thing a replay can refuse.
"""

import ast
import math
import re


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
