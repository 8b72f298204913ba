"""How numbers read in every report (terminal, Markdown, HTML): counts, floats (`inf` /
`nan` spelled out), percentages, byte sizes, a ULP count only where it means something,
and the worst parameter of an optimizer step.
"""

import math

from ..diff.explain.verdict import meaningful_ulp


def fmt(x, digits=3):
    """A number as a short human string ('-' for None)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1e15:
            return fmt(int(x))
        return f"{x:.{digits}g}"
    return str(x)


def ulp_cell(m, number=None) -> str:
    """A Metrics' max ULP as a reader should see it: the count where it means something
    (floating, finite, close values: `verdict.meaningful_ulp`), written by `number` (the
    renderer's own number format; `fmt` by default), else why it is left out."""
    if m is None or m.max_ulp is None:
        return "-"
    u = meaningful_ulp(m)
    if u is not None:
        return (number or fmt)(u)
    finite = all(x is None or math.isfinite(x) for x in (m.max_ulp, m.max_rel, m.max_abs))
    return "- (non-finite values)" if not finite else "- (values far apart; see rel)"


def worst_detail(step, f=fmt):
    """" (relative L2, max abs Y)" of an optimizer step's worst parameter (chosen by its
    own ||a-b|| / ||a||), "" when none was computed."""
    if step is None or step.worst_rel_l2 is None:
        return ""
    return f" ({f(step.worst_rel_l2)}, max abs {f(step.worst_max_abs)})"


def fmt_pct(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "-"
    return f"{100 * x:.3g}%"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"
