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

A setting that cannot be read or formatted (its `repr`, `str`, `float`, `==` or an attribute
raises; a key that is not a str) is skipped, never raised: the callers pass a
`skipped.Skipped`, which the manifest reports. Numbers and strings are read through their
base type's own methods, so a subclass's overrides are never called.
"""

import math

from .skipped import kind, name, text

MAX_SETTINGS = 256     # rows per optimizer step at most: a huge closure is not the settings
MAX_DEPTH = 8          # transformations nested this deep at most
MAX_TEXT = 48
_WRAPPERS = ("with_extra_args_support",)   # optax's own wrappers, not a transformation


def scalar(v):
    """(value, text) of a plain setting: a number, bool, None or short string, or a concrete
    array of one element; None for anything else (arrays, functions, tracers). May raise
    (an array-like whose attributes raise): the callers skip that setting."""
    if v is None or isinstance(v, str):
        return math.nan, ("None" if v is None else text(v))[:MAX_TEXT]
    if isinstance(v, bool):
        return float(v), text(v)
    if isinstance(v, (int, float)):
        shown = text(v)[:MAX_TEXT]
        try:
            return (float.__float__(v) if isinstance(v, float) else int.__float__(v)), shown
        except OverflowError:
            return math.nan, shown
    if "Tracer" in kind(v) or getattr(v, "size", None) != 1 or not hasattr(v, "dtype"):
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


def torch_groups(param_groups, skipped=None):
    """[(group, key, value, text)] of torch's `param_groups`; a setting that cannot be read
    or formatted is noted in `skipped` (a `skipped.Skipped`) and left out."""
    out = []
    for g, group in enumerate(param_groups):
        try:
            items = list(group.items())
        except Exception as exc:
            _skip(skipped, f"group {g}", exc)
            continue
        for k, v in items:
            try:
                out.extend(_torch_setting(g, label(k), v))
            except Exception as exc:
                _skip(skipped, f"group {g} {name(k)}", exc)
        if len(out) >= MAX_SETTINGS:
            break
    return out[:MAX_SETTINGS]


def _torch_setting(g, key, v):
    """The rows of one `param_groups` entry (may raise: the caller skips it)."""
    if key == "params":
        return [(g, "params", float(len(v)), str(len(v)))]
    if isinstance(v, (tuple, list)) and 0 < len(v) <= 4:
        rows = []
        for i, x in enumerate(v):
            got = scalar(x)
            if got is not None:
                rows.append((g, f"{key}/{i}", *got))
        return rows
    got = scalar(v)
    return [(g, key, *got)] if got is not None else []


def label(key):
    """A setting's key as text: a str, bool, int or float by its base type's own method,
    anything else by its `str` (which may raise: the setting is then skipped)."""
    got = text(key)
    return got if got is not None else str.__str__(str(key))


def _skip(skipped, where, exc):
    if skipped is not None:
        skipped.add(where, exc)


def _factory(fn):
    """'scale_by_adam' for `scale_by_adam.<locals>.update_fn`; '' for a plain function."""
    qual = text(getattr(fn, "__qualname__", "")) or ""
    return qual.split(".<locals>", 1)[0] if ".<locals>" in qual else ""


def _is_transformation(v):
    """An optax GradientTransformation (a NamedTuple of init and update), by its shape."""
    return isinstance(v, tuple) and callable(getattr(v, "update", None)) and \
        callable(getattr(v, "init", None))


def optax_settings(update, skipped=None):
    """[(0, key, value, text)] of the scalars an optax update function and the
    transformations inside it close over; one that cannot be read or formatted is noted
    in `skipped` and left out."""
    out = []
    _walk(update, "", out, 0, set(), skipped)
    return [(0, k, v, t) for k, v, t in out[:MAX_SETTINGS]]


def _walk(fn, prefix, out, depth, seen, skipped):
    try:
        fn = getattr(fn, "__wrapped__", None) or fn    # optax_tags' wrapper: the original
        factory = _factory(fn)
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        variables = code.co_freevars if code is not None else ()
    except Exception as exc:      # a callable whose attributes raise
        _skip(skipped, f"{prefix}<{kind(fn)}>", exc)
        return
    if depth > MAX_DEPTH or id(fn) in seen or len(out) >= MAX_SETTINGS:
        return
    seen.add(id(fn))
    if factory and factory not in _WRAPPERS:
        prefix = f"{prefix}{factory}/"
    if not variables or not cells:
        return
    for var, cell in zip(variables, cells):
        try:
            v = cell.cell_contents
        except ValueError:      # a cell not filled yet
            continue
        try:
            _closed(var, v, prefix, out, depth, seen, skipped)
        except Exception as exc:
            _skip(skipped, f"{prefix}{var}", exc)


def _closed(var, v, prefix, out, depth, seen, skipped):
    """The settings of one variable an update function closes over (may raise: the caller
    skips it)."""
    if _is_transformation(v):
        _walk(v.update, prefix, out, depth + 1, seen, skipped)
    elif isinstance(v, (tuple, list)) and v and all(callable(x) or _is_transformation(x)
                                                     for x in v):
        for i, x in enumerate(v):      # chain's update functions, in order
            _walk(x.update if _is_transformation(x) else x, f"{prefix}{i}/", out,
                  depth + 1, seen, skipped)
    elif isinstance(v, dict) and len(v) <= 32:    # inject_hyperparams' other settings
        for k, x in list(v.items()):
            key = text(k) if isinstance(k, str) else None
            try:
                got = scalar(x) if key is not None else None
            except Exception as exc:
                _skip(skipped, f"{prefix}{var}/{key}", exc)
                continue
            if got is not None:
                out.append((f"{prefix}{var}/{key}", *got))
    elif var == "mask" and v is not None:
        out.append((f"{prefix}mask", math.nan, "callable" if callable(v) else "pytree"))
    elif not callable(v):
        got = scalar(v)
        if got is not None:
            out.append((f"{prefix}{var}", *got))
