"""`confirm(a, b)`: the sources of the difference checked by runs tracediff makes itself.

`locate` estimates each source's share and names the settings that could explain it; here
side b's script is re-recorded on this machine with each differing setting set as on a,
one at a time, and (with two or more) each one alone. Each run is judged twice: how much
of the final difference it removes (`measure.distance`, as the shares measure it), and at
each source's op whether the run removed that op's difference or makes it on its own
(`measure.at_op`): the setting whose run does is that source's cause, found by experiment.
Where removing a setting and setting it alone disagree, the settings interact, and the
result says so. A source no setting reproduces is left to the machine or a library.
"""

from __future__ import annotations

import math
import os
import tempfile

from ... import shell
from ...errors import TraceError
from ...trace.reader import Trace
from ..differ import Differ
from ..explain.source_fixes import removes
from ..explain.verdict import recorded_backend
from ..result import Confirmation, ConfirmRun, SettingEffect, SourceCheck
from . import measure, op_runs, runs as _runs, settings as _settings, substitution

INTERACTION = 0.1   # removal and "alone" further apart than this (absolute): they interact


def confirm(a, b, workdir=None, max_runs=16, jobs=None, level="full", progress=None,
            dry_run=False, located=None, given=()) -> Confirmation:
    """Re-run b with settings of a and measure (see the module's docstring). `located`: a
    `LocateResult` of the two traces already made (else made here, with its sources).
    `given`: traces of b's script recorded elsewhere with a setting changed (`--with`: a
    TPU run at precision highest), measured as runs of their own; where b ran on an
    accelerator, nothing is re-run here and the commands to run there are printed."""
    progress = progress or (lambda *a, **k: None)
    ta, tb = Trace(a), Trace(b)
    try:
        found, unsettable = _settings.differing(ta.manifest, tb.manifest)
        if located is None:
            from ..locate import locate as _locate

            located = _locate(ta, tb, progress=progress)
        base = Differ(ta, tb)
        out = Confirmation(trace_a=str(a), trace_b=str(b), script="",
                           measures=measure.measured_what(base), distance=measure.distance(base),
                           unsettable=[[u.key, u.why] for u in unsettable])
        substitutable = [x for x in _sources(located) if x.mechanism in substitution.MECHANISMS]
        if not found and not substitutable:
            out.notes.append("no setting that a re-run can set differs between the two runs: "
                             "what differs is the machine, a library or the program itself; "
                             "nothing was re-run")
            out.sources = [_source_check(s, []) for s in _sources(located)]
            return out
        backend = recorded_backend(tb, "jax")
        there = backend if backend not in (None, "cpu") else ""
        if there or given or not found:
            if not found:   # the sources that substitution measures are measured below
                out.notes.append("no setting that a re-run can set differs between the two "
                                 "runs: only the sources measured by substitution are re-run")
            if there or given:
                return _elsewhere(ta, tb, out, located, found, given, there)
        out.script = _runs.script_of(ta.manifest, tb.manifest)
        specs = _plan(ta, tb, found, located, base, out, workdir, level, max_runs)
        if dry_run:
            out.notes.append("--dry-run: the runs were printed, not made")
            return out
        for run, (rc, seconds, err) in zip(out.runs, _runs.execute(specs, jobs, progress)):
            run.exit_code, run.seconds, run.error = rc, seconds, err
        at_ops = _measure_runs(ta, tb, out, located, progress)
        _effects(out, found)
        progress("re-running each source's op under each setting")
        by_op = op_runs.causes(ta, tb, found, _source_pairs(base, _sources(located)),
                               jobs) if found else {}
        out.sources = [_source_check(s, _causes(s, found, out.runs, at_ops, by_op),
                                     _together(s, out.runs, at_ops, by_op))
                       for s in _sources(located)]
        for sc in out.sources:
            _measured(sc, out)
            _substituted(sc, out)
        return out
    finally:
        ta.close()
        tb.close()


def _plan(ta, tb, found, located, base, out, workdir, level, max_runs):
    """The runs, in `out.runs` and as `RunSpec`s: b as recorded, b without each setting
    and each alone (`runs.plan`), then b with a's values at each source that only
    substitution measures (`substitution.specs`)."""
    folder = workdir or tempfile.mkdtemp(prefix="tracediff-confirm-")
    os.makedirs(folder, exist_ok=True)
    specs, out.skipped_runs = _runs.plan(ta.manifest, tb.manifest, found, out.script, folder,
                                         level=level, max_runs=max_runs)
    subst, notes = substitution.specs(
        base, _sources(located), folder, _settings.env_of(tb.manifest),
        shell.script_argv(tb.manifest) or [out.script], out.script, level)
    out.notes += notes
    out.runs = [ConfirmRun(name=s.name, reverted=[x.label for x in s.reverted], alone=s.alone,
                           command=_runs.command_line(s), trace=s.trace) for s in specs]
    out.runs += [ConfirmRun(name=s.name, reverted=[], substituted=rank,
                            command=_runs.command_line(s), trace=s.trace) for s, rank in subst]
    return specs + [s for s, _ in subst]


def _substituted(sc, out):
    """The measured part of a source whose run had a's values substituted for its outputs:
    what that run removes (the run's trace says how many events were substituted)."""
    for run in out.runs:
        if run.substituted == sc.rank and run.removal is not None:
            sc.measured = run.removal
            sc.verdict += "; measured with a's values substituted for its outputs"


def _elsewhere(ta, tb, out, located, found, given, there):
    """b's counterfactual runs are made on b's machine: print their commands (each
    source's, and b without each setting), and measure the traces given back."""
    if there:
        out.notes.append(f"b ran on a {there}: its runs are made there, not here. Run these "
                         f"there and give their traces back with --with TRACE:")
        lines = []
        for src in _sources(located):
            lines += [x for x in src.counterfactual if not x.startswith("#")
                      and " locate " not in x]
        argv = shell.script_argv(tb.manifest) or ["SCRIPT.py"]
        for s in found:
            if s.kind == "env":
                out_name = f"b_without_{s.name}.h5"
                lines += (shell.record_command(argv, out_name, {s.name: s.a}) if s.a is not None
                          else [shell.command("env", "-u", s.name, "tracediff", "record",
                                              "-o", out_name, *argv)])
        out.notes += list(dict.fromkeys(lines))
    whole = out.distance
    events = sorted({e for s in _sources(located) for e in _events(s)})
    recorded = Differ(ta, tb)
    before = {ea: measure.op_difference(recorded, ea) for ea in events}
    removed = {}
    for path in given:
        tg = Trace(path)
        try:
            sha = [((m or {}).get("script") or {}).get("sha256") for m in (tb.manifest, tg.manifest)]
            if sha[0] != sha[1]:
                raise TraceError(f"{path}: it ran another script than b (sha256 "
                                 f"{str(sha[1])[:12]} vs {str(sha[0])[:12]}): a run given with "
                                 f"--with changes a setting, not the script")
            label = _given_label(tb.manifest, tg.manifest)
            d = Differ(ta, tg)
            run = ConfirmRun(name=f"given {path}", reverted=[label], trace=str(path),
                             distance=measure.distance(d))
            if run.distance is not None and whole:
                run.removal = 1.0 - run.distance / whole
            out.runs.append(run)
            removed[label] = ({ea for ea in events if _shrank(before[ea],
                                                              measure.op_difference(d, ea))},
                              run.removal)
        finally:
            tg.close()
    for src in _sources(located):
        labels = [k for k, (evs, _) in removed.items() if set(_events(src)) & evs]
        sc = _source_check(src, [])
        if labels:
            sc.causes_measured = labels
            sc.verdict = "removed by the run given"
            sc.measured = removed[labels[0]][1] if len(labels) == 1 else None
        else:
            sc.verdict = ("not removed by the runs given" if given else
                          f"not measured: its runs are made on the {there}")
        out.sources.append(sc)
    return out


def _shrank(before, after) -> bool:
    """A run made elsewhere removed the op's own difference: its outputs now equal a's, or
    their difference fell to at most a tenth (a run on another machine keeps that machine's own rounding) while
    its inputs' did not (an op downstream of a removed source shrinks with its inputs)."""
    (out0, in0), (out1, in1) = before, after

    def fell(x, y):
        return x is not None and y is not None and x > 0 and y <= 0.1 * x

    if out0 is not None and out0 > 0 and out1 == 0.0:   # gone bitwise: its own part too
        return True
    return fell(out0, out1) and not fell(in0, in1)


def _given_label(mb, mg) -> str:
    """What a given trace changed against b: its settings, its matmul precision."""
    found, _ = _settings.differing(mb, mg)
    words = [f"{s.label}={s.b if s.b is not None else 'unset'}" for s in found]
    pb = (((mb or {}).get("frameworks") or {}).get("jax") or {}).get("jax_default_matmul_precision")
    pg = (((mg or {}).get("frameworks") or {}).get("jax") or {}).get("jax_default_matmul_precision")
    if pb != pg and not any("JAX_DEFAULT_MATMUL_PRECISION" in w for w in words):
        words.append(f"matmul precision {pg or 'default'}")
    return ", ".join(words) or "no setting differs from b"


def _sources(located):
    return list(located.sources.sources) if located is not None and located.sources else []


def _events(src):
    """The a events a source is judged at: its largest and its first."""
    return sorted({e for e in (src.event_a, src.first_event) if e >= 0})


def _source_pairs(d, sources):
    """[(a event, b event)] of the sources' events that are paired."""
    out = set()
    for src in sources:
        for ea in _events(src):
            eb = int(d.al.a2b[ea]) if ea < len(d.al.a2b) else -1
            if eb >= 0:
                out.add((ea, eb))
    return sorted(out)


def _measure_runs(ta, tb, out, located, progress):
    """Distances and removals of every run; {run index: {a event: at_op}} at the sources."""
    events = sorted({e for s in _sources(located) for e in _events(s)})
    at_ops = {}
    for i, run in enumerate(out.runs):
        progress("measuring the runs", i, len(out.runs))
        if not os.path.exists(run.trace):
            run.error = run.error or "no trace written"
            continue
        try:
            tr = Trace(run.trace)
        except TraceError as exc:
            run.error = f"its trace is unreadable: {exc}"
            continue
        try:
            d = Differ(ta, tr)
            run.distance = measure.distance(d)
            at_ops[i] = {ea: measure.at_op(d, ea) for ea in events}
            if i == 0:
                out.reproduced = measure.distance(Differ(tb, tr)) == 0.0
        finally:
            tr.close()
    whole = out.runs[0].distance if out.runs else None
    if out.reproduced is False:
        out.notes.append("b as re-run here does not give b's recorded values: the removals "
                         "are measured against the re-run, not against trace b")
    for run in out.runs:
        if run.distance is not None and whole:
            run.removal = 1.0 - run.distance / whole
    if whole == 0.0:
        out.notes.append("b as re-run here computes what a computed: the difference does not "
                         "come from a setting this machine can change")
    every = [r for r in out.runs if r.name == "every setting as on a"]
    if every and every[0].distance is not None and whole:
        out.residual = every[0].distance / whole
    elif len([r for r in out.runs if not r.substituted]) == 2 and \
            out.runs[1].removal is not None:
        out.residual = 1.0 - out.runs[1].removal
    return at_ops


def _effects(out, found):
    by_name = {r.name: r for r in out.runs}
    for s in found:
        without = by_name.get(f"without {s.label}")
        alone = by_name.get(f"{s.label} alone")
        e = SettingEffect(setting=s.label, a=s.a, b=s.b,
                          removal=without.removal if without else None,
                          alone=(alone.distance / out.runs[0].distance
                                 if alone and alone.distance is not None and
                                 out.runs[0].distance else None))
        e.interacts = _interaction(e)
        out.settings.append(e)


def _interaction(e) -> str:
    """Words where removing the setting and setting it alone disagree; independent
    settings add as squares, so without X the run keeps sqrt(1 - alone^2)."""
    if e.removal is None:
        return ""
    if e.removal < -0.05:
        return (f"without it the runs differ {-e.removal:.0%} more: it offsets what another "
                f"setting does")
    if e.alone is None:
        return ""
    expected = 1.0 - math.sqrt(max(0.0, 1.0 - min(1.0, e.alone) ** 2))
    if abs(e.removal - expected) > INTERACTION:
        return (f"alone it makes {e.alone:.0%} of the difference, yet removing it removes "
                f"{e.removal:.0%}: it acts together with another setting")
    return ""


def _causes(src, found, runs_, at_ops, by_op) -> list:
    """The settings that change the source's op bits when it is re-run alone on its
    recorded inputs (`op_runs`), or whose whole run removed the op's difference ("without
    X") or makes it on a's inputs ("X alone")."""
    out = []
    for s in found:
        if any(s in by_op.get(ea, ()) for ea in _events(src)):
            out.append(s)
            continue
        for i, run in enumerate(runs_):
            verdicts = [at_ops.get(i, {}).get(ea) for ea in _events(src)]
            if (run.name == f"without {s.label}" and measure.REMOVED in verdicts) or \
                    (run.alone == s.label and measure.MAKES in verdicts):
                out.append(s)
                break
    return out


def _together(src, runs_, at_ops, by_op) -> bool:
    """Did the run with every setting as on a remove the source's op difference, where its
    op could not be re-run alone (re-run alone and changed by no setting, it is none's)?"""
    if any(ea in by_op for ea in _events(src)):
        return False
    for i, run in enumerate(runs_):
        if run.name == "every setting as on a":
            return any(at_ops.get(i, {}).get(ea) == measure.REMOVED for ea in _events(src))
    return False


def _source_check(src, causes, together=False) -> SourceCheck:
    ops = ", ".join(f"{op} x{n}" if n > 1 else str(op) for op, n in (src.ops or [])[:4])
    keys = {k for s in causes for k in s.keys}
    if not causes and together:
        verdict = ("the settings together: gone with every setting as on a, but no one of "
                   "them alone was seen to change it (its inputs differ in every other run)")
    elif not causes:
        verdict = "no setting reproduces it here"
    elif src.mechanism == "dtype" and any(s.kind == "argv" for s in causes):
        verdict = "confirmed: the script's arguments choose the dtype (autocast or a cast)"
    elif not src.causes:
        verdict = "cause found"
    elif keys & set(src.causes):
        verdict = "confirmed" if src.causes[0] in keys else "confirmed (not locate's first cause)"
    else:
        verdict = "another cause"
    sc = SourceCheck(rank=src.rank, ops=ops, mechanism=src.mechanism,
                     estimated=removes(src.share) if src.share is not None else None,
                     causes_estimated=list(src.causes),
                     causes_measured=[s.label for s in causes], verdict=verdict)
    return sc


def _measured(sc, out):
    """The measured removal of the source's cause: the run without it (one cause), the run
    without every setting (all of them)."""
    by_name = {r.name: r for r in out.runs}
    if len(sc.causes_measured) == 1:
        run = by_name.get(f"without {sc.causes_measured[0]}")
        sc.measured = run.removal if run else None
    elif sc.causes_measured and len(sc.causes_measured) == len(out.settings):
        sc.measured = (1.0 - out.residual) if out.residual is not None else None


__all__ = ["confirm"]
