"""Why two paired outputs differ in dtype: the autocast state each side recorded at the op
(`capture/torch/autocast.py`: regions of events in the manifest), in one line that
findings put first ("float32 vs bfloat16: autocast on b (cpu bfloat16)")."""

import bisect


def autocast_regions(trace):
    """[(first, end, device type, dtype)] of the trace's autocast regions, sorted; [] when
    none were recorded (an older trace, or a JAX one). The manifest is untrusted: rows that
    are not four well-typed fields are skipped."""
    cache = getattr(trace, "_autocast_regions", None)
    if cache is not None:
        return cache
    fw = (trace.manifest.get("frameworks") or {}) if isinstance(trace.manifest, dict) else {}
    ac = ((fw.get("torch") or {}) if isinstance(fw, dict) else {})
    ac = ac.get("autocast") if isinstance(ac, dict) else None
    rows = ac.get("regions") if isinstance(ac, dict) else None
    out = []
    for r in rows if isinstance(rows, list) else ():
        if isinstance(r, list) and len(r) == 4 and all(isinstance(x, int) for x in r[:2]) and \
                all(isinstance(x, str) for x in r[2:]):
            out.append(tuple(r))
    out.sort()
    try:
        trace._autocast_regions = out
    except AttributeError:
        pass
    return out


def recorded(trace):
    """Did this trace record its autocast state (a torch trace of this version)?"""
    fw = trace.manifest.get("frameworks") if isinstance(trace.manifest, dict) else None
    torch = fw.get("torch") if isinstance(fw, dict) else None
    return isinstance(torch, dict) and isinstance(torch.get("autocast"), dict)


def autocast_at(trace, event):
    """"cpu bfloat16" (every device type on at once, comma-separated) when the event ran under
    autocast, "" when it did not or nothing was recorded."""
    regions = autocast_regions(trace)
    if not regions:
        return ""
    i = bisect.bisect_right(regions, (event, float("inf")))
    on = [f"{dev} {dt}" for first, end, dev, dt in regions[max(0, i - 64):i]
          if first <= event < end]
    return ", ".join(sorted(set(on)))


def dtype_note(ta, tb, ea, eb, dtypes_a, dtypes_b):
    """One line when the paired outputs differ in dtype, else "": the two dtypes (a vs b)
    and which side ran the op under autocast."""
    pairs = [(x, y) for x, y in zip(dtypes_a, dtypes_b) if x != y]
    if not pairs:
        return ""
    da, db = pairs[0]
    on = [(side, autocast_at(t, e)) for side, t, e in (("a", ta, ea), ("b", tb, eb))]
    why = "; ".join(f"autocast on {side} ({state})" for side, state in on if state)
    if not why:
        if not (recorded(ta) and recorded(tb)):   # JAX, or an older trace: dtypes alone
            return f"{da} vs {db}"
        why = "autocast off on both sides: the program casts"
    return f"{da} vs {db}: {why}"
