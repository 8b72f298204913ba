"""Comparing traces recorded at different levels (full / stats / calls), and the two-level
search for long runs.

A value is stored at one of three depths: its bytes (level full), its hash and statistics
(level stats or calls, or past a --max-bytes cap: `VFLAG_STATS`), or metadata only. Two
values can be compared whenever both have a hash:

* equal hashes (same dtype and shape) mean bitwise equal, at any level, where both traces
  hash with one function (`recording.hash`). Hashes of two functions are never evidence:
  where one side stored the bytes, they are hashed with the other side's function
  (`hashes_agree`); where neither did, the pair is not compared (it counts against
  coverage, never as a difference);
* different hashes with the bytes of both: the ordinary element-wise comparison;
* different hashes with only statistics on one side (or both): the statistics bound the
  largest element-wise difference from below (min, max and mean are 1-Lipschitz in the
  max norm; | ||a|| - ||b|| | <= sqrt(n) max |a - b|; different NaN/Inf counts mean a
  NaN or Inf against a number). When that lower bound exceeds the tolerance at the
  largest magnitude present, the value is *decided* beyond tolerance; otherwise it
  differs bitwise and whether it is within tolerance *cannot be decided* without the
  bytes. Integers, bools and keys are exact: a different hash is decided.

`annotate` returns (as a `Levels`, which locate puts into its result) what each side was
recorded with, what could and could not be decided, and, when a side is not a full
recording, the exact `tracediff record` commands that zoom in on the divergent step at
full level (the two-level search).
"""

import math
import os
import re

from ... import shell
from ...trace import schema
from ...untrusted import printable
from ...trace.values import DIGESTS, HASH_NAME, STAT_FIELDS, has_bytes
from . import values as compare
from ..result import Levels, LevelSide, Zoom, ZoomSide

def hashed(row):
    """True when the row's hash describes its exact bytes (bytes or stats stored)."""
    return row is not None and not (row["flags"] & schema.VFLAG_UNINIT) and (
        has_bytes(row) or bool(row["flags"] & schema.VFLAG_STATS))


def hash_name(t):
    """The hash function a trace's values were recorded with (older traces: xxh3_64)."""
    return getattr(t, "hash_name", HASH_NAME)


def same_hash_function(ta, tb):
    """Do two traces hash their values with one function? (Else their hashes, and their
    per-device digests, say nothing about each other.)"""
    return hash_name(ta) == hash_name(tb)


def hashes_agree(differ, row_a, row_b):
    """Do two value rows' hashes say their bytes are equal? Compared as recorded where both
    traces hash with one function; else the stored bytes of one side hashed with the other
    side's function; None where neither side stored bytes (two functions' hashes say
    nothing about each other)."""
    if same_hash_function(differ.ta, differ.tb):
        return int(row_a["hash"]) == int(row_b["hash"])
    for t, row, other, other_row in ((differ.ta, row_a, differ.tb, row_b),
                                     (differ.tb, row_b, differ.ta, row_a)):
        fn = DIGESTS.get(hash_name(other))
        if fn is not None and has_bytes(row):
            raw = t.stored_bytes(int(row["offset"]), int(row["nbytes"]), row["hash"])
            return fn(raw) == int(other_row["hash"])
    return None


NO_STATISTICS = "no statistics recorded"


def _counts(differ):
    c = getattr(differ, "level_counts", None)
    if c is None:
        c = differ.level_counts = {"hash_equal": 0, "stats_beyond_tolerance": 0,
                                   "stats_undecided": 0, "stats_missing": 0}
    return c


def not_compared(differ):
    """Per side, the events with a value pair that differs bitwise while one side has no
    statistics for it (a trace from before the statistics table, or written without it):
    nothing was compared there, whatever the verdict of the rest (diff/coverage.py)."""
    nc = getattr(differ, "stats_missing_events", None)
    if nc is None:
        nc = differ.stats_missing_events = (set(), set())
    return nc


def _missing(differ, row_a, row_b, m):
    if m.get("note") == NO_STATISTICS:
        nc = not_compared(differ)
        nc[0].add(int(row_a["event"]))
        nc[1].add(int(row_b["event"]))
    return m


def compare_hashed(differ, row_a, row_b, tol_dtype=None):
    """Metrics of two value rows of which at least one has only hash + statistics; None
    where their hashes, of two functions, cannot be compared (`hashes_agree`)."""
    ta, tb = differ.ta, differ.tb
    da, db = ta.string(row_a["dtype"]), tb.string(row_b["dtype"])
    shape_a, shape_b = ta.string(row_a["shape"]), tb.string(row_b["shape"])
    key = ("stats", int(row_a["hash"]), int(row_b["hash"]), da, db, shape_a, shape_b, tol_dtype)
    if key in differ._cmp_val:
        hit = differ._cmp_val[key]
        return hit if hit is None else _missing(differ, row_a, row_b, hit)
    agree = hashes_agree(differ, row_a, row_b)
    if agree is None:
        differ._cmp_val[key] = None
        return None
    r, t = compare.tolerance(tol_dtype or da, differ.rtol, differ.atol)
    counts = _counts(differ)
    if agree and da == db and shape_a == shape_b:
        counts["hash_equal"] += 1
        m = {"bitwise_equal": True, "within_tolerance": True, "max_abs": 0.0, "max_rel": 0.0,
             "max_ulp": 0.0, "mismatch_fraction": 0.0, "beyond_tolerance_fraction": 0.0,
             "rtol": r, "atol": t, "compared_by": "hash"}
        differ._cmp_val[key] = m
        return m
    sa, sb = ta.value_stats(row_a), tb.value_stats(row_b)
    m = stats_metrics(sa, sb, da, db, shape_a, shape_b, r, t)
    counts["stats_beyond_tolerance" if m["decided"] else "stats_missing"
           if m["note"] == NO_STATISTICS else "stats_undecided"] += 1
    differ._cmp_val[key] = m
    return _missing(differ, row_a, row_b, m)


def stats_metrics(sa, sb, da, db, shape_a, shape_b, rtol, atol):
    """Metrics of two bitwise-different values known only by their statistics."""
    m = {"bitwise_equal": False, "compared_by": "stats", "rtol": rtol, "atol": atol,
         "max_ulp": None, "max_rel": None, "mismatch_fraction": None,
         "beyond_tolerance_fraction": None, "stats_a": sa, "stats_b": sb}
    decided, lb, why = False, 0.0, ""
    if da != db or shape_a != shape_b:
        decided, why = True, "dtype or shape differ"
    elif not compare.is_floating(da) or (rtol == 0 and atol == 0):
        decided, why = True, "exact dtype: a different hash is a different value"
    elif sa is None or sb is None:
        why = NO_STATISTICS      # not compared (coverage), never agreement
    elif sa["nan"] != sb["nan"] or sa["inf"] != sb["inf"]:
        decided, lb, why = True, math.inf, "NaN/Inf counts differ"
    else:
        n = 1
        for d in (shape_a.split(",") if shape_a else ()):
            n *= max(int(d), 1)
        bounds = []
        for f in ("min", "max"):
            x, y = sa[f], sb[f]
            if math.isfinite(x) and math.isfinite(y):
                bounds.append(abs(x - y))
        if sa["nan"] == 0 and sa["inf"] == 0:
            # mean and L2 are rounded sums, accumulated in float32 for one large float32
            # value (the mean pairwise: relative error ~ eps * log2 n; the L2 by a BLAS dot
            # whose blocking differs between machines: ~ eps * sqrt n); allow for that,
            # min and max are exact
            rms = max(sa["l2"], sb["l2"]) / math.sqrt(n)
            slack = 1e-6 * rms * max(1.0, math.log2(n))
            slack_l2 = slack + rms * 2.0 ** -23 * math.sqrt(n)
            bounds.append(max(0.0, abs(sa["mean"] - sb["mean"]) - slack))
            bounds.append(max(0.0, abs(sa["l2"] - sb["l2"]) / math.sqrt(n) - slack_l2))
        lb = max([b for b in bounds if math.isfinite(b)] or [0.0])
        scale = max((abs(v) for s in (sa, sb) for v in (s["min"], s["max"])
                     if math.isfinite(v)), default=0.0)
        if lb > atol + rtol * scale:
            decided, why = True, (f"statistics differ by at least {lb:.3g}, more than the "
                                  f"tolerance at the largest magnitude ({scale:.3g})")
        else:
            why = ("bitwise different; the statistics agree within tolerance, so whether the "
                   "values do cannot be decided without their bytes (--level full)")
    m["decided"] = decided
    m["within_tolerance"] = not decided
    m["max_abs"] = lb
    m["max_abs_is_lower_bound"] = True
    m["note"] = why
    return m


def _level(t):
    rec = t.manifest.get("recording") or {}
    return rec.get("level") or "full", rec


def _zoom_cmd(t, rec, step_lo, step_hi, out, env, extra=()):
    """(note lines, command) recording steps step_lo..step_hi-1 of t's run at level full."""
    argv = shell.script_argv(t.manifest)
    if argv is None:
        script = t.manifest.get("script") or {}
        argv = [script.get("path") or script.get("name") or "SCRIPT.py"]
    options = ["--level", "full", *extra, "--steps", f"{step_lo}:{step_hi}"]
    if rec.get("loops") and rec.get("loops") != "opaque":
        options += ["--loops", str(rec["loops"])]
    *notes, cmd = shell.record_command(argv, out, env, options)
    return notes, cmd


def annotate(first_difference, first_beyond_tolerance, ta, tb, differ):
    """(`Levels`, [warnings]) of a comparison: how each side was recorded, what was and
    was not decided, the zoom commands; a warning when something could not be decided."""
    la, ra = _level(ta)
    lb, rb = _level(tb)
    counts = dict(getattr(differ, "level_counts", None) or
                  {"hash_equal": 0, "stats_beyond_tolerance": 0, "stats_undecided": 0,
                   "stats_missing": 0})
    info = Levels(a=_side(la, ra), b=_side(lb, rb), compared_without_bytes=counts)
    warnings = []
    if not same_hash_function(ta, tb):
        warnings.append(f"the traces hash values differently ({hash_name(ta)} vs "
                        f"{hash_name(tb)}): a value whose bytes one side stored was hashed "
                        f"with the other side's function; one neither stored was not "
                        f"compared (record both with one --hash)")
    cheap = la != "full" or lb != "full"
    fd, ft = first_difference, first_beyond_tolerance
    if fd is not None:
        info.decided.append(f"first bitwise difference: event {fd.a.index} "
                            f"({fd.a.op}, step {fd.a.step}) - hashes are exact")
    if ft is not None:
        how = ft.metrics is not None and ft.metrics.compared_by == "stats"
        info.decided.append(f"first difference beyond tolerance: event {ft.a.index} "
                            f"({ft.a.op}, step {ft.a.step})" +
                            (" - proven by its statistics" if how else ""))
    if counts["stats_undecided"]:
        info.not_decided.append(
            f"{counts['stats_undecided']} value pair(s) differ bitwise but only statistics were "
            f"recorded and they agree within tolerance: whether they are beyond tolerance is "
            f"unknown (the verdict treats them as within tolerance)")
        warnings.append(info.not_decided[-1] + "; zoom in at --level full to decide")
    if counts.get("stats_missing"):
        info.not_decided.append(
            f"{counts['stats_missing']} value pair(s) differ bitwise and one side recorded no "
            f"statistics for them (its statistics table lacks them): not compared")
        warnings.append(info.not_decided[-1] + "; record that run again (--level stats or full)")
    if la == "calls" or lb == "calls":   # calls implies cheap
        info.not_decided.append("calls level: operations inside compiled calls and eager "
                                "ops were not recorded; the op cannot be named")
    if cheap and fd is not None:
        steps = []
        for f in (fd, ft):
            if f is not None and int(f.a.step) not in steps:
                steps.append(int(f.a.step))
        for s in steps:
            info.zoom.append(_recipe(ta, tb, ra, rb, s, f"step{s}",
                                     f"zoom in on step {s} at full level"))
    for f in (ft, fd):   # a compiled-call divergence no replayed equation explains
        if f is not None and f.compiled == "replay matches" and f.a.op.startswith(("jit:", "compiled:")):
            s = int(f.a.step)
            info.zoom.append(_recipe(
                ta, tb, ra, rb, s, f"probe{s}",
                f"narrow compiled call {f.a.op} (step {s}) below the call with its compiled "
                f"probe", extra=("--probe", probe_pattern(f.a.op))))
            break
    return info, warnings


def _side(level, rec):
    return LevelSide(level=level, steps=rec.get("steps"), ops=rec.get("ops"),
                     modules=rec.get("modules"), max_bytes=rec.get("max_bytes"),
                     values_capped_at_event=rec.get("values_capped_at_event"))


def probe_pattern(op):
    """The `record --probe` regex that selects exactly the jit call named `jit:NAME` (or
    the torch.compile graphs of frame NAME, `compiled:NAME[:backward]`); one printable
    line (a control character is the regex escape `\\xNN` / `\\uNNNN`)."""
    name = op[len('jit:'):] if op.startswith('jit:') else op
    if op.startswith("compiled:"):
        name = op[len("compiled:"):]
        name = name[:-len(":backward")] if name.endswith(":backward") else name
    return "^" + "".join(re.escape(c) if printable(c) == c else printable(c) for c in name) + "$"


def _recipe(ta, tb, ra, rb, s, suffix, title, extra=()):
    """The pair of `record` commands (one per machine, with the environment variables that
    differ between the runs) and the `locate` that follows them, as a `Zoom`. One process
    of a jax.distributed run: every process's command (`jax_processes`), into a folder."""
    sides = {}
    ea, eb = ta.manifest.get("env"), tb.manifest.get("env")
    for side, t, rec, env in (("a", ta, ra, shell.env_differences(ea, eb)),
                              ("b", tb, rb, shell.env_differences(eb, ea))):
        procs = jax_processes(t.manifest, t.path)
        if procs is not None:
            sides[side] = _process_zoom(t, rec, s, suffix, env, extra, procs)
            continue
        root, ext = os.path.splitext(t.path)
        out = f"{root}.{suffix}{ext or '.h5'}"
        notes, cmd = _zoom_cmd(t, rec, s, s + 1, out, env, extra)
        sides[side] = ZoomSide(trace=out, command=cmd, notes=notes,
                               on=t.manifest.get("hostname"))
    return Zoom(a=sides["a"], b=sides["b"],
                then=shell.command("tracediff", "locate", sides["a"].trace, sides["b"].trace),
                step=s, title=title)


_RANK_FILE = re.compile(r"^(.*?)(^|\.)rank(\d{1,6})\.h5$")
MAX_PROCESS_COMMANDS = 64


def _process_count(manifest):
    """(this process's index, the process count) of one process of a jax.distributed run
    of several, else None."""
    d = manifest.get("distributed") if isinstance(manifest, dict) else None
    if not isinstance(d, dict):
        return None
    r, n = d.get("process_index"), d.get("process_count")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (r, n)) or \
            not 0 <= r < n or n < 2:
        return None
    return r, n


def jax_processes(manifest, path):
    """[(process id, argv)] of every process of the jax.distributed run that recorded the
    trace at `path` (its `manifest`), from the per-rank traces beside it (`rank{K}.h5`,
    `NAME.rank{K}.h5`, as `tracediff record` names them): each process has its own
    command line (its process id, the coordinator). Only this trace's own entry when a
    sibling is missing or disagrees (more than MAX_PROCESS_COMMANDS processes: its alone);
    None when the trace is not one process of several."""
    from ...trace.reader import Trace

    rn = _process_count(manifest)
    if rn is None:
        return None
    r, n = rn
    own = [(r, shell.script_argv(manifest))]
    path = os.fspath(path)
    m = _RANK_FILE.match(os.path.basename(path))
    if m is None or n > MAX_PROCESS_COMMANDS:
        return own
    out = []
    for k in range(n):
        if k == r:
            out.append(own[0])
            continue
        sibling = os.path.join(os.path.dirname(path), f"{m.group(1)}{m.group(2)}rank{k}.h5")
        try:
            with Trace(sibling) as other:
                if _process_count(other.manifest) != (k, n):
                    return own
                out.append((k, shell.script_argv(other.manifest)))
        except Exception:   # missing or unreadable: this process's command only
            return own
    return out


def _process_zoom(t, rec, s, suffix, env, extra, procs):
    """The zoom `ZoomSide` of a jax.distributed run: one `record` line per process (its
    JAX_PROCESS_ID, its own command line), all started together into one folder; the
    last line waits for them."""
    r, n = _process_count(t.manifest)
    m = _RANK_FILE.match(os.path.basename(t.path))
    folder = os.path.dirname(os.path.abspath(t.path))
    if m is not None and m.group(1):
        folder = os.path.join(folder, m.group(1))
    out = f"{folder}.{suffix}/"
    lines = []
    if len(procs) == n:
        lines.append(shell.comment(
            f"a jax.distributed run of {n} processes: start them together, each with its "
            f"own process id and command line (one alone blocks at initialize)"))
    else:
        lines.append(shell.comment(
            f"process {r} of {n} of a jax.distributed run: run the matching command of "
            f"every other process (its command line is in its own trace's manifest) at the "
            f"same time; one alone blocks at jax.distributed.initialize"))
    for i, (k, argv) in enumerate(procs):
        penv = dict(env, **process_env(k, n))
        notes, cmd = _zoom_cmd(t, rec, s, s + 1, out, penv, extra) if argv is None else \
            _zoom_argv(argv, rec, s, out, penv, extra)
        lines += notes + [cmd + " &"]
    *notes, last = lines
    return ZoomSide(trace=out, command=last + " wait", notes=notes,
                    on=t.manifest.get("hostname"))


def process_env(k, n):
    """The variables that make `tracediff record` process k of n (docs/multiprocess.md)."""
    return {"JAX_PROCESS_ID": str(k), "JAX_NUM_PROCESSES": str(n)}


def _zoom_argv(argv, rec, s, out, env, extra):
    options = ["--level", "full", *extra, "--steps", f"{s}:{s + 1}"]
    if rec.get("loops") and rec.get("loops") != "opaque":
        options += ["--loops", str(rec["loops"])]
    *notes, cmd = shell.record_command(argv, out, env, options)
    return notes, cmd


def zoom_lines(result):
    """next_steps lines for the two-level search (empty for full recordings)."""
    info = result.levels
    out = []
    for z in (info.zoom if info is not None else ()):
        out.append(shell.comment(
            f"{z.title or 'zoom in on step ' + str(z.step)}: on machine a "
            f"({z.a.on or '?'}), then on machine b ({z.b.on or '?'}):"))
        for side in (z.a, z.b):
            out += side.notes or []
            out.append(side.command)
        out.append(z.then)
    return out


__all__ = ["annotate", "compare_hashed", "hashed", "hashes_agree", "same_hash_function",
           "stats_metrics", "zoom_lines", "STAT_FIELDS"]
