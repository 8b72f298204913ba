"""What changed at an op besides its tensors: its non-tensor arguments, and whether a
float64 replay verdict means anything for it.

A slice whose start moved (a data loader one row off), a dim, a scalar exponent, a
dtype: the recorded `params` summary of the two paired events says so, and the finding
names it ("start 8 vs 9"). Ops that only select, move, view or convert values compute
nothing to round, and integer ops are exact: "closer to the float64 result" says nothing
about them (`judged_by_float64`).
"""

from __future__ import annotations

from ..result import ArgDiff

MAX_SHOWN = 6        # differing arguments kept on a finding
MAX_VALUE_CHARS = 40

# ops that select, move, view, convert or create values: no arithmetic to round
# (base names: "aten::slice.Tensor" -> "slice", "index_put_" -> "index_put")
DATA_MOVEMENT = frozenset("""
    slice select index index_select gather take take_along_dim narrow masked_select
    masked_scatter scatter scatter_add scatter_reduce index_put index_copy index_fill
    masked_fill fill zero where embedding embedding_backward embedding_dense_backward
    view view_as reshape _reshape_alias _unsafe_view expand expand_as as_strided permute
    transpose t squeeze unsqueeze flatten unflatten unfold movedim split split_with_sizes
    chunk unbind cat concat stack hstack vstack roll flip repeat tile pad constant_pad_nd
    copy clone contiguous _to_copy to detach alias lift_fresh _copy_from
    _copy_from_and_resize type_as zeros ones full empty zeros_like ones_like full_like
    empty_like new_zeros new_ones new_full new_empty arange linspace scalar_tensor
    _local_scalar_dense item diagonal diag tril triu slice_scatter select_scatter
    one_hot
    dynamic_slice dynamic_update_slice concatenate broadcast_in_dim rev
    convert_element_type copy_p device_put select_n iota squeeze expand_dims
""".split())

_INTEGER_DTYPES = ("int", "uint", "bool")


def base_name(op: str) -> str:
    """'aten::index_put_.default' -> 'index_put'; 'dynamic_slice' stays."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def split_params(text: str) -> dict:
    """{name: value text} of a recorded params summary (`key=repr, ...`), split at
    top-level commas only (a tuple, list or string keeps its own); a part without `=`
    is kept under its position."""
    out, depth, quote, start, parts = {}, 0, None, 0, []
    text = text or ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for n, part in enumerate(p.strip() for p in parts):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if eq and (key.strip().isidentifier() or key.strip().isdigit()):
            out[key.strip()] = value.strip()
        else:
            out[f"#{n}"] = part
    return out


def _short(v):
    if v is None:
        return None
    return v if len(v) <= MAX_VALUE_CHARS else v[:MAX_VALUE_CHARS - 3] + "..."


def differing(params_a: str, params_b: str) -> list:
    """[ArgDiff] of the arguments whose recorded values differ (one side may lack one:
    None there), in a's order; [] when the summaries are equal or either was shortened
    when recorded (its tail is unknown)."""
    if (params_a or "") == (params_b or ""):
        return []
    pa, pb = split_params(params_a), split_params(params_b)
    out = []
    for k in list(pa) + [k for k in pb if k not in pa]:
        va, vb = pa.get(k), pb.get(k)
        if va == vb:
            continue
        if (va or "").endswith("...") or (vb or "").endswith("..."):
            continue   # shortened when recorded: not known to differ
        out.append(ArgDiff(name=k, a=_short(va), b=_short(vb)))
    return out[:MAX_SHOWN]


def text(diffs) -> str:
    """'start 8 vs 9, end 16 vs 17' (a missing side: '-')."""
    return ", ".join(f"{d.name} {d.a if d.a is not None else '-'} vs "
                     f"{d.b if d.b is not None else '-'}" for d in diffs)


def judged_by_float64(op: str, dtypes=()) -> bool:
    """Does "closer to the float64 (exact) result" mean something for this op: it
    computes (not a selection, view, copy or conversion) on floating values (integer
    outputs are exact)?"""
    if base_name(op) in DATA_MOVEMENT:
        return False
    if dtypes and all(str(d).startswith(_INTEGER_DTYPES) for d in dtypes):
        return False
    return True
