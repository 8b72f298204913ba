"""The one line of the mechanisms (`ReplayRun.mechanism`): which hypothesis reproduces each
side bitwise, the reduced-precision one it is consistent with (within `CONSISTENT_ULP`,
the kernel's own accumulation order not reproduced), or the closest one; with the fix of
a reduced-precision mechanism."""

import numpy as np

from .dispatch import DESCRIPTIONS
from .precision import fix_for, tpu_default_precision

def _fmt_ulp(x):
    if not np.isfinite(x):
        return "inf"
    return str(int(x)) if float(x).is_integer() and x < 1e6 else f"{x:.3g}"


FAR_ULP = 1e6


# a reduced-precision hypothesis this close, where none is bitwise, is what the side ran
# with an accumulation order of its own (a TPU's, a GPU's tensor cores): "consistent with"
CONSISTENT_ULP = 64
REDUCED_PRECISION = ("tf32_inputs", "bf16_inputs", "fp16_inputs")


def _consistent(mine, case):
    """The reduced-precision mechanism a side is consistent with (not bitwise: within
    CONSISTENT_ULP, and the closest hypothesis or, on a TPU at default precision, the bf16
    pass), else None."""
    for m in mine:
        if m.name in REDUCED_PRECISION and not m.bitwise and m.max_ulp <= CONSISTENT_ULP and \
                (m is mine[0] or (m.name == "bf16_inputs" and tpu_default_precision(case))):
            return m
    return None


def summary(mechs, ops, cases=None):
    """One line: which hypothesis reproduces each side bitwise, the reduced-precision one
    it is consistent with, or the closest one; with the fix of a reduced-precision one."""
    parts = []
    for side in ("a", "b"):
        mine = [m for m in mechs if m.side == side]
        if not mine:
            continue
        op = ops.get(side) or "op"
        case = (cases or {}).get(side)
        best = mine[0]
        tpu = (f"; {side} ran it on a TPU at default matmul precision" if
               tpu_default_precision(case) else "")
        close = None if best.bitwise else _consistent(mine, case)
        if best.bitwise:
            fix = fix_for(best.name, getattr(case, "framework", None))
            parts.append(f"{side}'s {op} is reproduced bitwise by "
                         f"{DESCRIPTIONS.get(best.name, best.name)} [{best.name}: {best.note}]"
                         + (tpu if best.name == "bf16_inputs" else "")
                         + (f"; fix: {fix}" if fix else ""))
        elif close is not None:
            fix = fix_for(close.name, getattr(case, "framework", None))
            parts.append(f"{side}'s {op} is consistent with {DESCRIPTIONS.get(close.name)}, "
                         f"{_fmt_ulp(close.max_ulp)} ULP from its closest variant (the order in "
                         f"which the kernel that ran it accumulates is not reproduced here) "
                         f"[{close.name}: {close.note}]" + (tpu if close.name == "bf16_inputs"
                                                             else "")
                         + (f"; fix: {fix}" if fix else ""))
        else:
            # a count of a million ULP and more is a different value, not a rounding
            far = not best.max_ulp < FAR_ULP
            parts.append(f"no hypothesis reproduces {side}'s {op} bitwise (closest: "
                         f"{best.name}, "
                         f"{'far off: a different value, not a rounding difference' if far else _fmt_ulp(best.max_ulp) + ' ULP'}"
                         f": {best.note})")
    return "; ".join(parts)
