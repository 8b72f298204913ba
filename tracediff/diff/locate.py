"""Locate the first divergence between two traces.

Two findings are reported, each as a `Finding`:

* `first_difference`: the first aligned event (in the order of trace a) whose outputs
  are not bitwise equal.
* `first_beyond_tolerance`: the first aligned event whose outputs differ beyond the
  tolerance (see `compare/values.py`). It decides the verdict and the exit code.

Rule for JAX compiled calls and replayed equations (the script saw the *compiled*
outputs of a `call`; its `eqn` events are an op-by-op replay from the call's real
inputs, which explains but is not what the script computed):

1. A `call` whose compiled outputs differ (at the level being searched) is resolved
   by descending into its replayed equations: the culprit is the first equation of
   that call whose inputs all match and whose outputs differ (the origin; when that
   equation is a nested `jit`, its own inner equations are searched the same way).
   If every replayed equation matches, the call itself is reported with the note that
   the divergence is inside the compiled program (fusion, compiler rewrites), not at
   any single equation.
2. A replayed equation (or an equation of the call's values program, `--jax-values
   compiled` and `--probe`: origin probe) that differs while the compiled outputs of its
   call match is a *replay-only* (*probe-only*) difference: the script never saw it. It can be the bitwise
   `first_difference` (marked `origin: replay` with a note saying the compiled outputs
   match), but it never decides the verdict: the tolerance search skips it and keeps
   the first such case in `replay_only` for information.
3. Every other kind (eager primitive, torch op, optimizer snapshot, input) is what the
   script saw and is reported as is; at the tolerance level, unless it is rounding noise
   around zero (`compare/nearzero.py`: beyond tolerance only where an input it reads element for
   element is noise near zero): the first such event is kept in `near_zero`, never the
   verdict.
4. A difference overwritten before anything reads it (the dataflow links it only to ops
   that write over it without reading it: a weight drawn, then a load's `copy_` over it)
   is passed over at both levels: the first is kept in `absorbed`, never the
   headline. `first_difference` is the first difference that reaches the outputs.

The verdict is about values: events that have no counterpart (the two runs executed
different ops, or one trace is truncated) are counted in `alignment`, named in a warning,
and never compared; a run whose paired events all agree is a `match`.

"Introduced here" (`inputs_match: true`): every input the event read is equal (bitwise
for the bitwise finding, within tolerance for the tolerance finding). Inputs come from
role-IN values stored on the event itself (call events) and from the inputs table: the
producer's value in a is compared with the value b's matching input row points at.
Literals and closed-over constants count as equal; an unknown producer, a producer
whose value was not stored, or an input b does not have gives `inputs_match: null`
with the reason.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import TraceError
from ..trace import schema
from ..trace.reader import Trace
from ..trace.values import rows_with_data
from .align import sequence as _align
from .explain import analysis as _analysis
from .explain import sources as _sources
from .compare import values as compare
from .pairing import compiled as _compiled
from .pairing import cross as _cross
from .compare import devices as _devices
from .compare import levels as _levels
from .align import structure as _structure
from . import coverage as _coverage
from .nonfinite import find_nonfinite
from .coverage import missed_frameworks
from .differ import BITWISE, TOLERANCE, Differ
from .explain.env import env_diff
from .result import LocateResult, Noise, Replay, TraceInfo

MAX_OPTIM_ROWS = 200


def _script_warnings(ta, tb):
    w = []
    sa, sb = ta.manifest.get("script") or {}, tb.manifest.get("script") or {}
    sa, sb = (sa if isinstance(sa, dict) else {}), (sb if isinstance(sb, dict) else {})
    cross = _frameworks(ta) and _frameworks(tb) and _frameworks(ta) != _frameworks(tb)
    if sa.get("sha256") and sb.get("sha256") and sa.get("sha256") != sb.get("sha256") and not cross:
        same = sa.get("name") == sb.get("name")
        w.append(f"the traces come from different scripts ({sa.get('name')} sha256 "
                 f"{str(sa.get('sha256'))[:12]} vs {sb.get('name')} sha256 "
                 f"{str(sb.get('sha256'))[:12]}{'' if not same else ', same name, edited'}); "
                 f"comparing anyway")
    for t, name in ((ta, "a"), (tb, "b")):
        if not t.complete:
            w.append(f"trace {name} ({os.path.basename(t.path)}) is truncated: the recording did "
                     f"not finish; events after its end cannot be compared")
        end = t.manifest.get("end") or {}
        end = end if isinstance(end, dict) else {}
        if end.get("status") not in (None, "ok", "exit", "completed", "success") and \
                end.get("exit_code") not in (None, 0):
            w.append(f"trace {name}: the recorded script ended with {end.get('status')} "
                     f"(exit {end.get('exit_code')})")
    return w


def _missed_text(ta, tb):
    parts = []
    for t, name in ((ta, "a"), (tb, "b")) if ta is not tb else ((ta, "the trace"),):
        fws = missed_frameworks(t)
        if fws:
            parts.append(f"{'trace ' + name if name in ('a', 'b') else name} "
                         f"({os.path.basename(t.path)}) lacks {' and '.join(fws)}, which its "
                         f"script loaded but the recording did not capture")
    return "; ".join(parts)


def _frameworks(t):
    return set(np.unique(t.events["framework"]).tolist()) - {0}


def _trace_info(t):
    m = t.manifest
    return TraceInfo(path=t.path, complete=bool(t.complete), events=int(len(t)),
                     script=(m.get("script") or {}).get("name"),
                     hostname=m.get("hostname"), created=m.get("created"))


def _traces(ta, tb, d):
    out = {"a": _trace_info(ta), "b": _trace_info(tb)}
    for side in ("a", "b"):   # cross-framework: which framework each side is
        fw = getattr(d, "fw_" + side, None)
        if fw is not None:
            out[side].framework = schema.FW_NAMES.get(fw, "")
    return out


def run(ta, tb, rtol=None, atol=None, differ=None, mapping=None) -> LocateResult:
    """Compare two open traces; returns a `LocateResult` (without the explanation)."""
    d = differ or Differ(ta, tb, rtol, atol)
    d.noise_skipped = set()
    first_bit, _ = d.search(BITWISE)
    first_tol, replay_only = d.search(TOLERANCE) if first_bit is not None else (None, None)
    steps = d.optimizer_steps()
    n_steps = len(steps)
    if len(steps) > MAX_OPTIM_ROWS:
        # keep it compact: the first steps, every step that got worse than all before,
        # and the last one
        kept, best = [], -1.0
        for i, r in enumerate(steps):
            if i < 20 or r.max_rel > best:
                kept.append(r)
            best = max(best, r.max_rel)
        steps = kept[:MAX_OPTIM_ROWS - 1] + ([steps[-1]] if kept[-1] is not steps[-1] else [])
    warnings = _script_warnings(ta, tb)
    departed = _devices.replica_only(ta, tb, d.al.a2b) if ta.has_devices() else None
    if departed:
        warnings.append(departed)
    stats = d.al.stats()
    if not mapping and (stats["only_in_a"] or stats["only_in_b"]):
        gap = d.al.gaps(1)[0]
        t = ta if gap["side"] == "a" else tb
        ops = sorted({t.string(o) for o in t.events["op"][gap["start"]:gap["start"] + gap["length"]]})
        warnings.append(
            f"the event sequences differ: {stats['only_in_a']} events only in a, "
            f"{stats['only_in_b']} only in b (first: {gap['length']} events of {gap['side']} from "
            f"#{gap['start']}: {', '.join(ops[:5])}{' ...' if len(ops) > 5 else ''}); "
            f"only paired events are compared")
    missed = _missed_text(ta, tb)
    if missed and first_tol is None:
        raise TraceError(f"not comparable: {missed}; the two traces agree on what they hold, "
                         f"but that is not the whole run: record again (this tracediff "
                         f"captures a framework whenever it is loaded)")
    if missed:
        warnings.append(f"{missed}: what that framework computed is not compared")
    first_param = getattr(d, "first_parameter", None)   # two frameworks: optimizer by role
    structural = _structural(d, first_bit) if not mapping else None
    for f in {id(x): x for x in (first_bit, first_tol) if x is not None}.values():
        _view_of_write(f, structural)
    cov = _coverage.measure(d)
    if first_tol is None and first_param is None and structural is None and \
            not cov.sufficient and hasattr(d, "pairing_stops"):
        # two frameworks: the pairing stopped, and the outputs differ (pairing/stops.py)
        first_tol = d.pairing_stops(TOLERANCE)
        first_bit = first_bit or first_tol
    levels, level_warnings = _levels.annotate(first_bit, first_tol, ta, tb, d)
    near_zero, near_zero_total = _near_zero(d)
    absorbed, absorbed_total = _absorbed(d)
    diverged = first_tol is not None or first_param is not None or structural is not None
    if not diverged and not cov.sufficient:
        warnings.append("INCONCLUSIVE: every compared value agrees, but too little was "
                        "compared for a match: " + "; ".join(cov.reasons[:3]))
    return LocateResult(
        path_a=ta.path, path_b=tb.path, coverage=cov,
        verdict="diverged" if diverged else "match" if cov.sufficient else "inconclusive",
        first_parameter=first_param, structural=structural,
        first_difference=first_bit, first_beyond_tolerance=first_tol, replay_only=replay_only,
        alignment=d.al.stats(), gaps=d.al.gaps(), env_diff=env_diff(ta.manifest, tb.manifest),
        optimizer_steps=steps, warnings=warnings + level_warnings,
        traces=_traces(ta, tb, d),
        tolerance={"rtol": rtol, "atol": atol, "defaults": {k: list(v) for k, v in
                                                              compare.DEFAULT_TOLERANCES.items()},
                   **({"ulp": d.ulp} if d.ulp is not None else {})},
        mapping=mapping or [], optimizer_steps_total=n_steps,
        noise=_noise_info(d), levels=levels, near_zero=near_zero,
        near_zero_total=near_zero_total, absorbed=absorbed, absorbed_total=absorbed_total,
        nonfinite=_nonfinite(ta, tb, warnings))


def _nonfinite(ta, tb, warnings):
    """{"a": NonFinite | None, "b": ...}: where each side's NaN or Inf came from, None
    where neither holds one; a failure is a warning, never a failed comparison."""
    try:
        a = find_nonfinite(ta)
        b = a if tb is ta else find_nonfinite(tb)
    except Exception as exc:  # the origin of a NaN is a bonus on top of the comparison
        warnings.append(f"the origin of non-finite values was not searched: "
                        f"{type(exc).__name__}: {str(exc)[:160]}")
        return None
    return None if a is None and b is None else {"a": a, "b": b}


def _near_zero(d):
    """(the first event the tolerance search passed over as rounding noise around zero,
    as a `Finding` whose note says why; how many it passed over)."""
    st = d.near_zero_state
    if st is None or st.first is None:
        return None, 0
    ea, eb, why = st.first
    f = d.finding(ea, eb, TOLERANCE, note=(
        f"rounding noise around zero, not counted as beyond tolerance: {why}"))
    return f, st.count


def _absorbed(d):
    """(the first difference the bitwise search passed over because it was overwritten
    before anything read it, as a `Finding` whose note names what wrote over it; how
    many)."""
    st = (getattr(d, "absorbed_state", None) or {}).get(BITWISE)
    if st is None or st[0] is None:
        return None, 0
    ea, eb, readers = st[0]
    names = ", ".join(f"{d.ta.string(d.ta.events['op'][r])} #{r}" for r in readers[:3].tolist())
    f = d.finding(ea, eb, BITWISE, note=(
        f"overwritten before anything read it: the ops it goes to ({names}) write over it "
        f"without reading its values, so it never reaches the outputs"))
    return f, st[1]


def _structural(d, first_bit):
    """The earliest op only one run has that changed the values after it, when it comes
    before the first value difference (align/structure.py: `first`); None for two
    frameworks or eager against compiled (their pairing is not a sequence alignment)."""
    if isinstance(d, (_cross.CrossDiffer, _compiled.EagerCompiledDiffer)) or \
            getattr(d.sa, "transparent", None) is None:
        return None
    s = _structure.first_inserted(d, None if first_bit is None else first_bit.a.index)
    if s is not None:
        s.first = True
    return s


def _view_of_write(f, structural):
    """A view as the first difference reads what an in-place write only one run executed
    wrote (`p.to_local().mul_`): say so on it (`Finding.note`), the write changed the values."""
    if structural is None or not _structure.is_view(f.a.op) or \
            not _structure.is_inplace_write(structural.event.op):
        return
    e = structural.event
    f.note = (f"{f.a.op} is a view: it only reinterprets what it reads; the values were "
              f"changed by {e.op} ({structural.side} #{e.index}), an in-place write only "
              f"{structural.side} executed")


def _noise_info(d):
    if d.noisy is None:
        return None
    skipped = sorted(d.noise_skipped)
    return Noise(nondeterministic_events=int(np.count_nonzero(d.noisy)),
                 skipped=[{"index": e, "op": d.ta.string(d.ta.events[e]["op"])}
                          for e in skipped[:20]],
                 skipped_total=len(skipped),
                 note="ops whose outputs differ between the two --noise runs (recorded on one "
                      "machine) while their inputs are equal are nondeterministic there: they "
                      "are never blamed as the origin (what they cause downstream is inherited)")


MAX_NOISE_CHECKS = 20000


def noise_mask(ta, n1, n2):
    """Bool per event of `ta`: its counterpart differs between noise traces n1 and n2."""
    dn = Differ(n1, n2)
    ia, ib = dn.pairs()
    diff = dn.sa.content[ia] != dn.sb.content[ib]
    # only the origins of the nondeterminism (their inputs are equal between the two runs):
    # what they cause downstream is not excused, it is reported as inherited
    bad = [e1 for e1, e2 in list(zip(ia[diff].tolist(), ib[diff].tolist()))[:MAX_NOISE_CHECKS]
           if dn.inputs_match(e1, e2, BITWISE)[0] is not False]
    bad = np.asarray(bad, np.int64)
    if n1 is ta or os.path.abspath(n1.path) == os.path.abspath(ta.path):
        to_a = np.arange(len(ta))
    else:
        strings = _align.StringIds()
        s1, sa = _align.prepare(n1, strings), _align.prepare(ta, strings)
        to_a = _align.align(s1, sa).a2b
    mask = np.zeros(len(ta), bool)
    hit = to_a[bad] if len(bad) else np.zeros(0, np.int64)
    mask[hit[hit >= 0]] = True
    return mask


def locate(a, b=None, rtol: Optional[float] = None, atol: Optional[float] = None,
           map_file: Optional[str] = None, ulp: Optional[float] = None,
           noise: Optional[Sequence] = None, explain: bool = True,
           progress: Optional[Callable] = None, sources: bool = True) -> LocateResult:
    """Python API: compare two trace files (paths or open `Trace` objects).

    Traces of different frameworks (or a `map_file`) go through the cross-framework
    pairing of `pairing/cross.py`; so does one trace that recorded both (`b` None: its JAX
    events are a, its torch events b). `ulp`: elements within this many ULP are within tolerance
    (alone, or in addition to rtol/atol when those are given). `noise`: two traces
    recorded on a's machine; events that differ between them are never blamed.
    `explain`: replay the origin and add the short verdict and the chain (`explain`,
    `chain`) and every source of the difference, ranked (`sources`, with `explain`).
    `progress(phase, done=None, total=None)`: called as the work goes (the CLI's bar)."""
    result, _ = _locate(a, b, rtol, atol, map_file, ulp, noise, progress,
                        explain=explain, full=False, sources=sources)
    return result


def locate_with_analysis(a, b, event: Optional[int] = None, rtol: Optional[float] = None,
                         atol: Optional[float] = None, map_file: Optional[str] = None,
                         ulp: Optional[float] = None, noise: Optional[Sequence] = None,
                         progress: Optional[Callable] = None) -> tuple:
    """(LocateResult, Analysis or None) for `tracediff explain`: `locate` with the
    explanation, and the full `Analysis` it was made from (of `event`, an event of trace
    a, when given). The analysis is None when it failed (the result's `explain` says why)."""
    return _locate(a, b, rtol, atol, map_file, ulp, noise, progress, explain=True,
                   full=True, event=event)


def _locate(a, b, rtol, atol, map_file, ulp, noise, progress, explain, full, event=None,
            sources=True):
    progress = progress or _no_progress

    if rtol is not None and (rtol < 0 or rtol != rtol):
        raise TraceError(f"invalid --rtol {rtol}")
    if atol is not None and (atol < 0 or atol != atol):
        raise TraceError(f"invalid --atol {atol}")
    if ulp is not None and (ulp < 0 or ulp != ulp):
        raise TraceError(f"invalid --ulp {ulp}")
    own = []
    try:
        ta = a if isinstance(a, Trace) else Trace(a)
        if ta is not a:
            own.append(ta)
        if b is None:
            tb = ta
            if _cross.sides(ta, ta) is None:
                lost = missed_frameworks(ta)
                raise TraceError(f"{ta.path}: locate needs two traces, or one trace that "
                                 f"recorded both JAX and PyTorch (this one holds "
                                 f"{' and '.join(sorted(_names(ta))) or 'no events'}" +
                                 (f"; its script also loaded {' and '.join(lost)}, which the "
                                  f"recording did not capture: record again" if lost else "")
                                 + ")")
        else:
            tb = b if isinstance(b, Trace) else Trace(b)
            if tb is not b:
                own.append(tb)
        progress("aligning the event sequences")
        try:
            d, mapping = open_differ(ta, tb, rtol, atol, map_file)
            d.ulp = ulp
            d.progress = progress
            if noise:
                n1, n2 = (x if isinstance(x, Trace) else Trace(x) for x in noise)
                own += [x for x, y in zip((n1, n2), noise) if x is not y]
                d.noisy = noise_mask(ta, n1, n2)
            result = run(ta, tb, rtol, atol, differ=d, mapping=mapping)
            analysis = None
            if explain or full:
                progress("explaining: replaying the origin op")
                result, analysis = _explained(result, d, full, event, sources, progress)
            return result, analysis
        except (ValueError, IndexError, KeyError, OSError) as exc:
            # damaged tables (bad shapes, dangling references) that the reader let through
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise TraceError(f"cannot compare {ta.path} and {tb.path}: damaged trace? "
                             f"({type(exc).__name__}: {msg})") from None
    finally:
        for t in own:
            t.close()


def nothing_to_compare(path) -> Optional[str]:
    """Why the trace at `path` holds nothing a comparison could fail on (a golden trace
    that `check` would match against nothing), or None: no events, or no value whose
    bytes or hash were recorded (every value metadata only or uninitialised)."""
    with Trace(path) as t:
        if not len(t):
            return "it holds no events"
        v = t.values
        if not rows_with_data(v)[1].any():
            return (f"none of its {len(t):,} events recorded a value" if not len(v) else
                    f"its {len(v):,} values are metadata only (no bytes, no hash)")
    return None


def open_differ(ta, tb, rtol=None, atol=None, map_file=None):
    """The one differ factory: (Differ, None) for traces of one framework, the
    cross-framework differ and its mapping for two frameworks or a user map, the
    eager-vs-compiled differ for a PyTorch run against a torch.compile run."""
    if _cross.sides(ta, tb) is not None:
        return _cross.cross_differ(ta, tb, rtol, atol, map_file)
    if map_file is not None and ta is not tb:
        fw_a, fw_b = _frameworks(ta), _frameworks(tb)
        if len(fw_a) == 1 and fw_a == fw_b:
            d = _cross.CrossDiffer(ta, tb, rtol, atol, map_file, frameworks=(*fw_a, *fw_b))
            return d, d.mapping()
    if _compiled.is_eager_vs_compiled(ta, tb):
        return _compiled.EagerCompiledDiffer(ta, tb, rtol, atol), None
    return Differ(ta, tb, rtol, atol), None


def _names(t):
    return {schema.FW_NAMES.get(f, "?") for f in _frameworks(t)}


def _no_progress(phase, done=None, total=None):
    pass


def _explained(result, d, full=False, event=None, sources=True, progress=None):
    """(the result with the short replay verdict and the chain, the full `Analysis` when
    `full`), with every source of the difference (`sources`); an explanation that fails
    never fails locate."""
    progress = progress or _no_progress
    if result.first_difference is None and event is None:
        return result, (_analysis.analyse(result, d) if full else None)
    unrounded = _not_rounding(result.first_difference)
    if unrounded and event is None and not full:     # locate: `explain` still analyses it
        return dataclasses.replace(result, explain=Replay(verdict=unrounded)), None
    try:
        analysis = _analysis.analyse(result, d, event)
    except TraceError:
        raise
    except Exception as exc:  # an explanation must never break locate
        replay = Replay(verdict=f"no explanation: {type(exc).__name__}: {str(exc)[:160]}")
        return dataclasses.replace(result, explain=replay), None
    explain, chain = _analysis.short(analysis)
    if sources:
        progress("sources: where differences enter")
        analysis.sources = _find_sources(d, result)
    o = analysis.origin
    if o is not None and o.dtype_note and explain is not None:
        # a change of dtype explains the origin before any numeric mechanism does
        cast = f"computed in another dtype ({o.dtype_note})"
        explain = dataclasses.replace(
            explain, mechanism=cast + (f"; {explain.mechanism}" if explain.mechanism else ""))
    fb = result.first_beyond_tolerance   # with what its own op adds, where it was replayed
    fb = next((x for x in (analysis.tolerance_origin, o) if x is not None and fb is not None
               and x.a.index == fb.a.index and x.local_error is not None), fb)
    return (dataclasses.replace(result, explain=explain, chain=chain, first_beyond_tolerance=fb,
                                sources=analysis.sources),
            analysis if full else None)


def _not_rounding(f):
    """Why the origin is not replayed, where no rounding can explain it (two frameworks,
    `pairing/shapes.py`, `pairing/stops.py`): two ops returning other shapes, two tables each
    side computes, outputs compared where the pairing stopped; else None."""
    layer = getattr(f, "layer", None) or {}
    if layer.get("shape"):
        return (f"not replayed: the two ops return other shapes ({layer['shape']['text']}): "
                f"what differs is their arguments, not their rounding")
    if layer.get("table"):
        return ("not replayed: two tables each side computes from values of its own differ "
                "(not a rounding)")
    if layer.get("outputs"):
        return ("not replayed: the outputs were compared where the pairing stopped; the ops "
                "between were not paired")
    return None


def _find_sources(d, result):
    """Every source of the difference (explain/sources.py); a failure never fails locate."""
    try:
        return _sources.find(d, result)
    except Exception as exc:  # the sources are a bonus on top of the located result
        return _sources.Sources(note=f"no sources: {type(exc).__name__}: {str(exc)[:160]}")
