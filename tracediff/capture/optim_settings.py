"""An optimizer's settings where its framework exposes them, as rows of the trace's
`optim_settings` table (docs/format.md): (group, key, value, text).

Why: two ports whose grads agree and whose optimizer state or step does not differ in the
optimizer itself (optax `b2=0.95` against torch's 0.999); naming the setting, with the
value on each side, needs the settings. Nothing here imports torch or optax; only scalars
are read (a value that is an array of one element is read as a number only when it is
concrete: a traced value inside `jit` is skipped), and nothing the program holds is changed.

* torch: each of `optimizer.param_groups`' scalar entries (`lr`, `eps`, `weight_decay`,
  `amsgrad`, `maximize`, `foreach`, `fused`, ...), a tuple of scalars by index (`betas/0`,
  `betas/1`), and `params`: how many parameters the group holds (the snapshot stores the
  parameters group by group, so a parameter's group is read from its position).
* optax: the scalars each transformation of the update closes over, keyed by the path of
  transformations (`chain/0/scale_by_adam/b2`, `chain/1/masked/add_decayed_weights/
  weight_decay`, `chain/2/scale/step_size`); a mask, a schedule or another function only
  by its kind (`masked/mask` = "callable" or "pytree"). `inject_hyperparams` keeps its
  hyperparameters in the optimizer state: the snapshot holds them already
  (`state/hyperparams/b2`).
"""

import math

MAX_SETTINGS = 256     # rows per optimizer step at most: a huge closure is not the settings
MAX_DEPTH = 8          # transformations nested this deep at most
MAX_TEXT = 48
_WRAPPERS = ("with_extra_args_support",)   # optax's own wrappers, not a transformation


def scalar(v):
    """(value, text) of a plain setting: a number, bool, None or short string, or a concrete
    array of one element; None for anything else (arrays, functions, tracers)."""
    if v is None or isinstance(v, str):
        text = "None" if v is None else v
        return math.nan, text[:MAX_TEXT]
    if isinstance(v, bool):
        return float(v), str(v)
    if isinstance(v, (int, float)):
        try:
            return float(v), repr(v)[:MAX_TEXT]
        except OverflowError:
            return math.nan, repr(v)[:MAX_TEXT]
    kind = type(v).__name__
    if "Tracer" in kind or getattr(v, "size", None) != 1 or not hasattr(v, "dtype"):
        return None
    if getattr(v, "is_cuda", False) or getattr(v, "requires_grad", False):
        return None         # a torch tensor on a device: reading it would synchronise
    try:
        x = v.item()
    except Exception:
        return None
    if isinstance(x, (bool, int, float)):
        return scalar(x)
    return None


def torch_groups(param_groups):
    """[(group, key, value, text)] of torch's `param_groups`."""
    out = []
    for g, group in enumerate(param_groups):
        for k, v in group.items():
            if k == "params":
                out.append((g, "params", float(len(v)), str(len(v))))
                continue
            if isinstance(v, (tuple, list)) and 0 < len(v) <= 4:
                for i, x in enumerate(v):
                    got = scalar(x)
                    if got is not None:
                        out.append((g, f"{k}/{i}", *got))
                continue
            got = scalar(v)
            if got is not None:
                out.append((g, str(k), *got))
        if len(out) >= MAX_SETTINGS:
            break
    return out[:MAX_SETTINGS]


def _factory(fn):
    """'scale_by_adam' for `scale_by_adam.<locals>.update_fn`; '' for a plain function."""
    qual = getattr(fn, "__qualname__", "") or ""
    return qual.split(".<locals>", 1)[0] if ".<locals>" in qual else ""


def _is_transformation(v):
    """An optax GradientTransformation (a NamedTuple of init and update), by its shape."""
    return isinstance(v, tuple) and callable(getattr(v, "update", None)) and \
        callable(getattr(v, "init", None))


def optax_settings(update):
    """[(0, key, value, text)] of the scalars an optax update function and the
    transformations inside it close over."""
    out = []
    _walk(update, "", out, 0, set())
    return [(0, k, v, t) for k, v, t in out[:MAX_SETTINGS]]


def _walk(fn, prefix, out, depth, seen):
    fn = getattr(fn, "__wrapped__", None) or fn    # optax_tags' wrapper: the original
    if depth > MAX_DEPTH or id(fn) in seen or len(out) >= MAX_SETTINGS:
        return
    seen.add(id(fn))
    name = _factory(fn)
    if name and name not in _WRAPPERS:
        prefix = f"{prefix}{name}/"
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return
    for var, cell in zip(code.co_freevars, cells):
        try:
            v = cell.cell_contents
        except ValueError:      # a cell not filled yet
            continue
        if _is_transformation(v):
            _walk(v.update, prefix, out, depth + 1, seen)
        elif isinstance(v, (tuple, list)) and v and all(callable(x) or _is_transformation(x)
                                                         for x in v):
            for i, x in enumerate(v):      # chain's update functions, in order
                _walk(x.update if _is_transformation(x) else x, f"{prefix}{i}/", out,
                      depth + 1, seen)
        elif isinstance(v, dict) and len(v) <= 32:    # inject_hyperparams' other settings
            for k, x in v.items():
                got = scalar(x) if isinstance(k, str) else None
                if got is not None:
                    out.append((f"{prefix}{var}/{k}", *got))
        elif var == "mask" and v is not None:
            out.append((f"{prefix}mask", math.nan, "callable" if callable(v) else "pytree"))
        elif not callable(v):
            got = scalar(v)
            if got is not None:
                out.append((f"{prefix}{var}", *got))
