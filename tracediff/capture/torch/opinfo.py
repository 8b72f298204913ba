"""What the recorder knows about an aten op: `_OpInfo` (its name, argument names, the
arguments it writes, which outputs are uninitialised memory), computed once per
overload, and `params`, the short deterministic summary of an op's non-tensor
arguments that becomes its event's `params` column (memoised per argument values)."""

from . import loaded

_UNINIT_OPS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                         "aten::new_empty_strided", "aten::empty_permuted"})
# outputs of custom ops that are (partly) uninitialised memory: FSDP2's all-gather buffer,
# of which the op fills only this rank's part (the all-gather after it fills the rest)
_UNINIT_OUTPUTS = {"fsdp::all_gather_copy_in": frozenset({1})}
_FUNCOL = "_c10d_functional::"
_FUNCOL_DONE = frozenset({"_c10d_functional::wait_tensor"})


class _Every:
    def __contains__(self, slot):
        return True


_EVERY_SLOT = _Every()
_SCALAR_TYPES = (bool, int, float, complex)
_MAX_PARAM = 48
_MAX_PARAMS = 160


def _tensor_like(a):
    """A tensor, None, or a list of tensors: dataflow, not a parameter."""
    if isinstance(a, loaded.torch.Tensor) or a is None:
        return True
    return isinstance(a, (list, tuple)) and bool(a) and isinstance(a[0], loaded.torch.Tensor)


def _short_repr(v):
    """repr of a plain argument (numbers, strings, dtypes, devices, lists of those);
    other objects (storages, script objects) are named by type only: their repr can be
    huge or hold an address. A subclass of a plain type (an optimizer's `lr`) is shown by
    its base type's repr: its own may raise (issue 66: the torch capture stopped)."""
    if isinstance(v, (list, tuple)):
        if len(v) > 8 or not all(isinstance(x, _PLAIN) for x in v):
            return f"<{type(v).__name__} of {len(v)}>"
        if all(type(x) in _PLAIN for x in v):
            r = repr(v)
        else:
            inner = ", ".join(_plain_repr(x) for x in v)
            r = f"({inner},)" if isinstance(v, tuple) and len(v) == 1 else \
                f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    elif not isinstance(v, _PLAIN + _torch_plain_types()):
        return f"<{type(v).__name__}>"
    else:
        r = _plain_repr(v) if isinstance(v, _PLAIN) else repr(v)
    return r if len(r) <= _MAX_PARAM else r[:_MAX_PARAM - 3] + "..."


def _plain_repr(v):
    """repr of a plain value by its base type's own repr (a subclass's is not called)."""
    if type(v) in _PLAIN:
        return repr(v)
    for base in (int, float, complex, str):     # bool has no subclasses
        if isinstance(v, base):
            return base.__repr__(v)
    return repr(v)


_PLAIN = (bool, int, float, complex, str, type(None))
_KEY_T = object()   # stands for a tensor in `_params_cached`'s keys
_MISS = object()
_TORCH_PLAIN = None


def _torch_plain_types():
    global _TORCH_PLAIN
    if _TORCH_PLAIN is None:
        torch = loaded.torch
        _TORCH_PLAIN = (torch.dtype, torch.device, torch.memory_format, torch.layout)
    return _TORCH_PLAIN


class _OpInfo:
    """Per-aten-overload facts computed once: name, argument names, writes, uninit."""

    __slots__ = ("name", "arg_names", "write_pos", "write_kw", "uninit", "skip", "collective",
                 "view", "func", "call", "uninit_slots", "optional_tensors")

    def __init__(self, func):
        self.func = func   # held: the recorder's cache is keyed by id(func)
        # what `func(*args)` calls: a plain OpOverload's __call__ is one Python frame
        # around its C++ `_op`, called directly (a subclass keeps its own __call__)
        op_cls = getattr(getattr(loaded.torch, "_ops", None), "OpOverload", None)
        direct = getattr(func, "_op", None)
        self.call = direct if (direct is not None and op_cls is not None and
                               type(func).__call__ is op_cls.__call__) else func
        sch = func._schema
        self.name = sch.name if func._overloadname == "default" else f"{sch.name}.{func._overloadname}"
        self.arg_names = [a.name for a in sch.arguments]
        # `Tensor?` arguments: one passed as None is a parameter (`bias=None`), so that a
        # replay knows which optional tensor the recorded inputs leave out
        self.optional_tensors = frozenset(
            a.name for a in sch.arguments
            if str(a.type) in ("Tensor?", "Optional[Tensor]"))
        self.write_pos, self.write_kw = [], []
        for i, a in enumerate(sch.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                (self.write_kw if a.kwarg_only else self.write_pos).append((i, a.name))
        self.uninit = sch.name in _UNINIT_OPS
        self.uninit_slots = _UNINIT_OUTPUTS.get(sch.name)
        if sch.name.startswith(_FUNCOL) and sch.name not in _FUNCOL_DONE:
            # a functional collective's result is defined only once `wait_tensor` returns
            # (recorded as its own op, with the received value): never compared before
            self.uninit_slots = _EVERY_SLOT
        # a view (as_strided, slice, view...) of uninitialised memory is uninitialised too
        # (DDP carves its gradient buckets out of an `empty` this way)
        self.view = any(r.alias_info is not None and not r.alias_info.is_write
                        for r in sch.returns)
        # record_function brackets (profiler::) carry no numbers and an object address.
        self.skip = sch.name.startswith("profiler::")
        self.collective = sch.name.startswith("c10d::")   # collectives.py records these


class _OpParams:
    """The `params` summary of an op's non-tensor arguments (a mixin of `TorchCapture`)."""

    def _params_cached(self, info, args, kwargs):
        """`_params`, memoised per op and non-tensor argument values (bounded)."""
        Tensor = loaded.torch.Tensor
        try:
            key = (info, tuple([_KEY_T if isinstance(a, Tensor) else
                                (tuple([_KEY_T if isinstance(y, Tensor) else y for y in a])
                                 if isinstance(a, (list, tuple)) else a) for a in args]),
                   tuple([(k, _KEY_T if isinstance(v, Tensor) else v)
                          for k, v in kwargs.items()]) if kwargs else None)
            hit = self._pcache.get(key, _MISS)
        except Exception:   # an unhashable argument (or one without a plain ==): no cache
            return self._params(info, args, kwargs)
        if hit is _MISS:
            hit = self._params(info, args, kwargs)
            if len(self._pcache) < 50_000:
                self._pcache[key] = hit
        return hit

    def _params(self, info, args, kwargs):
        """Short deterministic summary of the non-tensor arguments."""
        names = info.arg_names
        none = info.optional_tensors
        parts = [f"{names[i] if i < len(names) else i}={_short_repr(a)}"
                 for i, a in enumerate(args)
                 if not _tensor_like(a) or (a is None and i < len(names) and names[i] in none)]
        if kwargs:
            parts += [f"{k}={_short_repr(a)}" for k, a in kwargs.items()
                      if k != "pin_memory" and (not _tensor_like(a) or (a is None and k in none))]
        if not parts:
            return None
        s = ", ".join(parts)
        return s if len(s) <= _MAX_PARAMS else s[:_MAX_PARAMS - 3] + "..."
