"""What one jaxpr equation is, computed once per equation (`Site`).

JAX caches jaxprs, so an equation met at every step is the same object: its op name, its
parameters summarised as text (`summarize_params`, bounded: they fill the trace's string
table), its source line, its literal inputs, its optax tag and how it is replayed (bound
as is, or entered: nested calls, `cond`, loops, `shard_map`) are worked out the first
time and kept (`JaxCapture.site`). replay.py and probe.py read them.
"""

import numpy as np

from . import internals
from .optax_tags import OPTAX_TAG

_CALL_PRIMS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
               "custom_vjp_call_jaxpr", "remat2", "checkpoint"}
_LOOP_PRIMS = {"while", "scan"}

# the params summary's bounds (they bound the trace's string table): one value's text,
# the whole summary's; a value or tail that does not fit is written "..." (replay then
# says the parameters were shortened), never cut in the middle
_PARAM_VALUE_CAP, _PARAMS_CAP = 60, 240
# primitives whose parameters are recorded whole: a convolution's, in a form replay rebuilds
# (their tuples of ints are bounded by the array's rank); a `name` equation's checkpoint
# name, which holds the optimizer tag and its parameter path that pairing reads back
# (`tracediff:optax/grads/...`; cut to `name=...`, a port's backward lost its seeds)
_WHOLE_PARAMS = frozenset({"conv_general_dilated", "name"})


def _int_tuple(val):
    return isinstance(val, (tuple, list)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) or _int_tuple(x)
        for x in val)


def _param_text(val):
    """repr of one value; a ConvDimensionNumbers written as its three specs in full."""
    if type(val).__name__ == "ConvDimensionNumbers" and len(val) == 3 and _int_tuple(val):
        lhs, rhs, out = (tuple(int(d) for d in spec) for spec in val)
        return f"ConvDimensionNumbers(lhs_spec={lhs!r}, rhs_spec={rhs!r}, out_spec={out!r})"
    return repr(val)


def summarize_params(params, prim=None):
    """`key=repr, ...` of an equation's parameters (sorted by name; jaxprs, callables and
    reprs holding addresses left out). Values over `_PARAM_VALUE_CAP` characters are
    written `key=...` and a summary over `_PARAMS_CAP` ends in `...` after its last whole
    value, except for `_WHOLE_PARAMS` primitives, whose int tuples and dimension numbers
    and names are written whole."""
    whole = prim in _WHOLE_PARAMS
    parts = []
    for key in sorted(params):
        val = params[key]
        tname = type(val).__name__
        if "Jaxpr" in tname or callable(val) or tname in ("WrappedFun",):
            continue
        if isinstance(val, (tuple, list)) and val and "Jaxpr" in type(val[0]).__name__:
            continue
        text = _param_text(val)
        if " at 0x" in text:
            continue
        if len(text) > _PARAM_VALUE_CAP and not (whole and (
                _int_tuple(val) or isinstance(val, str)
                or text.startswith("ConvDimensionNumbers("))):
            text = "..."
        part = f"{key}={text}"
        parts.append(part)
    out = ", ".join(parts)
    if whole or len(out) <= _PARAMS_CAP:
        return out
    while parts and len(", ".join(parts + ["..."])) > _PARAMS_CAP:
        parts.pop()
    return ", ".join(parts + ["..."])


class Site:
    """Static facts about one jaxpr equation, computed once (jaxprs are cached by JAX)."""

    __slots__ = ("eqn", "op", "params", "name_stack", "source", "sub", "mode", "literals",
                 "rows", "rows_writer", "tag")

    def __init__(self, eqn, session):
        self.eqn = eqn  # keeps id(eqn) valid as a cache key
        # per writer (`JaxCapture.eqn_event`): the events' constant parts by (name-stack
        # prefix, call source, origin, device), and the literals prepared for the writer
        self.rows, self.rows_writer = {}, None
        prim = eqn.primitive.name
        # nested jits are named like top-level calls: `jit:_normal_real`, whatever the
        # primitive is called in this JAX version (`pjit` before 0.7)
        self.op = f"jit:{eqn.params.get('name', '?')}" if prim in internals.JIT_NAMES else prim
        self.params = summarize_params(eqn.params, prim)
        self.name_stack = str(eqn.source_info.name_stack)
        tb = eqn.source_info.traceback
        self.source = None if tb is None else \
            session.jax_site((fr.file_name, fr.line_num) for fr in tb.frames)
        # literal inputs (`mul x 2.0`), stored as role-IN values so that replay and repro
        # can rebuild the op from the trace alone
        self.literals = []
        from jax.extend.core import Literal

        for slot, v in enumerate(eqn.invars):
            if isinstance(v, Literal):
                try:
                    self.literals.append((slot, np.asarray(v.val, dtype=v.aval.dtype)))
                except Exception:  # a literal numpy cannot hold (PRNG key): left unrecorded
                    pass
        # the optax tag of a `name` equation (optax_tags), else None
        self.tag = eqn.params["name"][len(OPTAX_TAG):] if prim == "name" and \
            str(eqn.params.get("name", "")).startswith(OPTAX_TAG) else None
        self.sub, self.mode = None, "bind"
        p = eqn.params
        if prim in _CALL_PRIMS:
            from jax.extend.core import ClosedJaxpr

            for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
                sub = p.get(key)
                if sub is None:
                    continue
                if not isinstance(sub, ClosedJaxpr) and hasattr(sub, "eqns"):
                    sub = ClosedJaxpr(sub, ())
                if isinstance(sub, ClosedJaxpr) and len(sub.jaxpr.invars) == len(eqn.invars):
                    self.sub, self.mode = sub, "call"
                break
        elif prim == "cond":
            self.mode = "cond"
        elif prim in _LOOP_PRIMS:
            self.mode = prim
        elif prim == "shard_map" and "mesh" in p and "jaxpr" in p and "in_specs" in p:
            self.mode = "shard_map"   # replayed per device (devices.BodyReplay)
        if eqn.effects and not eqn.outvars:
            self.mode = "skip"  # debug prints and other output-less effects: never run twice
