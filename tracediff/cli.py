"""Command line: record, info, show, locate, explain, repro, report, check, demo.

Bad input: one line on stderr that says how to fix it, exit code 2.
"""

import contextlib
import functools
import json
import os
import sys

import click

from ._version import __version__
from .errors import TraceError, one_line
from .report.common import fmt_bytes
from .report.json_report import build as build_json
from .shell import command
from .untrusted import printable


def _guard(fn):
    """Turn TraceError (and unreadable input) into one clear line and exit code 2.

    Any other exception escaping a command is also one line and exit code 2 (a trace
    from a stranger must never produce a traceback); TRACEDIFF_DEBUG=1 shows it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TraceError as exc:
            click.echo(f"tracediff: error: {one_line(exc)}", err=True)
            sys.exit(2)
        except BrokenPipeError:
            sys.exit(0)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except MemoryError:
            click.echo("tracediff: error: out of memory (is the trace damaged or hostile?)",
                       err=True)
            sys.exit(2)
        except Exception as exc:
            if os.environ.get("TRACEDIFF_DEBUG"):
                raise
            click.echo(f"tracediff: error: unexpected {type(exc).__name__}: {one_line(exc)} "
                       f"(a damaged input? TRACEDIFF_DEBUG=1 shows the traceback)", err=True)
            sys.exit(2)

    return wrapper


@contextlib.contextmanager
def _stdout():
    """Output to stdout that must reach it: a write or flush error (a full disk, EIO) is
    one TraceError line, not an "unexpected" one, and not a second error at exit."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        try:   # what is still buffered goes nowhere at exit, instead of failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        raise TraceError(f"cannot write to standard output: {exc.strerror or exc}") from None


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Ordered(click.Group):
    """List commands in workflow order (record, inspect, compare, report), not A-Z."""

    def list_commands(self, ctx):
        return list(self.commands)


def _need_trace(path, what="trace"):
    """A clear error, with the fix, for a trace argument that is not there."""
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such {what} file (record one with: "
                         f"{command('tracediff', 'record', '-o', path)} SCRIPT.py [ARGS...])")


def _user_map(spec):
    """--map, inline JSON or a JSON file, read and checked before any trace is opened
    (bounded; a FIFO or device refused at once): the dict, or None."""
    if spec is None:
        return None
    from .diff.pairing.mapfile import load_map

    return load_map(spec)


def _tolerance_options(fn):
    fn = click.option("--atol", type=click.FloatRange(min=0), default=None, metavar="X",
                      help="Absolute tolerance for every floating dtype (default: per dtype, "
                           "e.g. 1e-6 for float32).")(fn)
    fn = click.option("--rtol", type=click.FloatRange(min=0), default=None, metavar="X",
                      help="Relative tolerance for every floating dtype (default: per dtype, "
                           "e.g. 1e-5 for float32).")(fn)
    return fn


def _explain_options(fn):
    """Options shared by locate and explain: --ulp, --noise."""
    fn = click.option("--noise", nargs=2, type=click.Path(dir_okay=False), default=None,
                      metavar="A1.h5 A2.h5",
                      help="Two traces of the same script recorded on a's machine: events "
                           "whose values differ between them are nondeterministic there and "
                           "are never blamed as the origin.")(fn)
    fn = click.option("--ulp", type=click.FloatRange(min=0), default=None, metavar="N",
                      help="Elements at most N ULP apart (in their dtype) are within "
                           "tolerance; alone it replaces the rtol/atol rule, with --rtol/--atol "
                           "either rule suffices.")(fn)
    return fn


class _Progress:
    """A transient rich progress bar on stderr for `locate`/`explain` (phase, bar, work
    done), only on a terminal, and only once the work has run `DELAY_S` seconds (a quick
    locate prints nothing extra: a timer starts the bar, so a long phase that reports
    nothing still shows it); elsewhere a no-op callback."""

    DELAY_S = 2.0

    def __init__(self, quiet=False):
        import threading

        self._bar, self._task, self._timer = None, None, None
        self._last = ("reading traces", None, None)
        self._lock, self._done = threading.Lock(), False
        self._on = not (quiet or os.environ.get("TRACEDIFF_NO_PROGRESS") or
                        not sys.stderr.isatty())

    def _start(self):
        from rich.console import Console
        from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeElapsedColumn)

        with self._lock:
            if self._done:
                return
            phase, done, total = self._last
            self._bar = Progress(TextColumn("tracediff: {task.description}"), BarColumn(),
                                 TaskProgressColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task(phase, total=total, completed=done or 0)
            self._bar.start()

    def __call__(self, phase, done=None, total=None):
        if not self._on:
            return
        with self._lock:
            self._last = (phase, done, total)
            if self._bar is not None:
                self._bar.update(self._task, description=phase, completed=done or 0,
                                 total=total)

    def __enter__(self):
        if self._on:
            import threading

            self._timer = threading.Timer(self.DELAY_S, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            if self._bar is not None:
                self._bar.stop()


def _sizes(*paths):
    return fmt_bytes(sum(os.path.getsize(p) for p in paths if os.path.isfile(p)))


def _bytes_per_step(path):
    """"; values: 205 MB a step (median of 30 steps)..." for a trace just recorded at full:
    what the level costs per optimizer step, and the way to record long runs. Read with
    plain h5py (our own file, just written); "" when it cannot be told."""
    try:
        import h5py
        import numpy as np

        with h5py.File(path, "r", locking=False) as f:
            n = int(f.attrs["committed_events"])
            step = f["events"].fields("step")[:n]
            rows = f["values"].fields(["event", "nbytes"])[:int(f.attrs["committed_values"])]
        rows = rows[(rows["event"] >= 0) & (rows["event"] < n)]
        per = np.bincount(step[rows["event"]] - step.min(), weights=rows["nbytes"]) \
            if len(rows) else np.zeros(0)
        per = per[per > 0]
    except Exception:
        return ""
    if not len(per):
        return ""
    return (f"; values: {fmt_bytes(float(np.median(per)))} a step (median of {len(per)} "
            f"step{'s' if len(per) != 1 else ''}). Long runs: --level stats, then --level "
            f"full --steps A:B around the step that matters")


def _source_dir_option(fn):
    """--source-dir: the only way a local source file is read (the trace's recorded lines
    are shown otherwise); see report/common.py `source_context`."""
    return click.option(
        "--source-dir", type=click.Path(exists=True, file_okay=False), default=None,
        metavar="DIR",
        help="Show the culprit's code from this folder (your checkout of the script's "
             "folder) instead of the lines the trace recorded, when the file there is the "
             "recorded one (same sha256). Only regular files inside DIR are read.")(fn)


def _print_result(result, as_json=False, verbose=False, quiet=False, source_dir=None):
    if quiet:
        return
    for w in result.warnings:
        click.echo(f"tracediff: warning: {printable(w)}", err=True)
    if as_json:
        click.echo(json.dumps(build_json(result), indent=2))
    else:
        from .report.terminal import print_locate

        print_locate(result, verbose=verbose, source_dir=source_dir)


@click.group(cls=_Ordered, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tracediff")
def main():
    """Find the first operation where two runs of a numerical ML program disagree.

    Record the same script twice (two machines, two library versions, two flags),
    then compare the traces:

    \b
      tracediff record -o a.h5 train.py --steps 3     # run a
      tracediff record -o b.h5 train.py --steps 3     # run b, elsewhere
      tracediff locate a.h5 b.h5                      # the first op that differs
      tracediff report a.h5 b.h5 -o report.md         # Markdown for a bug report
      tracediff check golden.h5 train.py --steps 3    # CI: compare with a golden

    \b
    Exit codes: 0 match, 1 diverged, 2 error (the message says how to fix it), 3
    inconclusive (nothing differs in what was compared, but too little was compared).
    `tracediff demo` runs the whole workflow on a bundled example.
    `tracediff COMMAND -h` explains each command.
    """


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.option("-o", "--output", default="trace.h5", show_default=True, metavar="FILE",
              help="Trace file to write (HDF5; overwritten). Under torchrun / a launcher, "
                   "rank R writes NAME.rankR.h5; a directory (run_a/) gets rankR.h5 per "
                   "rank (trace.h5 for one process).")
@click.option("--loops", type=click.Choice(["opaque", "stepped"]), default="opaque",
              show_default=True, help="JAX while/scan: one event per loop, or one per iteration.")
@click.option("--framework", "frameworks", multiple=True, type=click.Choice(["jax", "torch"]),
              help="Capture only this framework; repeat for both (default: every one the "
                   "script imports).")
@click.option("--level", type=click.Choice(["full", "stats", "calls"]), default="full",
              show_default=True,
              help="full: every value's bytes. stats: per value a hash of the exact bytes and "
                   "min/max/mean/L2/NaN/Inf (~64 bytes). calls: only top-level jit calls and "
                   "optimizer steps (hash + stats), no JAX replay: near-zero overhead.")
@click.option("--steps", default=None, metavar="START:STOP",
              help="Record only optimizer steps START..STOP-1 (e.g. 30:40, 30:, or 7).")
@click.option("--ops", default=None, metavar="REGEX",
              help="Keep values only of ops whose name matches (e.g. 'dot|addmm'); other "
                   "events are recorded without values.")
@click.option("--modules", default=None, metavar="GLOB",
              help="Keep values only of ops under these module paths / name stacks "
                   "(e.g. 'rnn.*,head'); other events are recorded without values.")
@click.option("--max-bytes", default=None, metavar="SIZE",
              help="Stop storing value bytes past SIZE (e.g. 2GB); later values keep hash and "
                   "stats. The trace says where the cap was reached.")
@click.option("--probe", default=None, metavar="REGEX",
              help="JAX: for jit functions whose name matches, also compile the call's "
                   "equations with every intermediate as a program output and record those "
                   "compiled values, to narrow a divergence inside a compiled call.")
@click.option("--devices/--no-devices", default=True, show_default=True,
              help="JAX: also record every shard/replica of a sharded or replicated array "
                   "with its device, and replay shard_map/pmap bodies device by device.")
@click.option("--jax-values", type=click.Choice(["auto", "replay", "compiled"]), default="auto",
              show_default=True,
              help="JAX, levels full/stats: where the values of the equations inside a jit "
                   "call come from. replay: each equation re-run on its own (faithful per "
                   "primitive, slow on long runs). compiled: the call's jaxpr compiled once "
                   "with every intermediate as an output (fast; values of a program XLA may "
                   "fuse differently, recorded as origin=probe). auto: compiled on an "
                   "accelerator (TPU/GPU), replay on the CPU; the trace says which.")
@click.option("--hash", "hash_name", type=click.Choice(["auto", "xxh3_64", "words64"]),
              default="auto", show_default=True,
              help="The hash of each value's exact bytes. words64 is computed by XLA on the "
                   "device (and by numpy on the host): a CPU trace recorded with --hash "
                   "words64 compares hash to hash with a TPU trace. auto: words64 where JAX "
                   "values are hashed on an accelerator, else xxh3_64 (faster on a CPU).")
@click.option("--codec", type=click.Choice(["none", "zstd"]), default="none", show_default=True,
              help="Compress the stored value bytes (level full) with Zstandard, through the "
                   "hdf5plugin package (pip install tracediff-ml[codec]). Measured on a JAX "
                   "MLP's intermediates: 91% of the bytes, at ~300 MB/s of one core; it pays "
                   "only where the disk is slower than that or the values repeat. Reading "
                   "such a trace needs hdf5plugin too.")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@_guard
def record(output, loops, frameworks, level, steps, ops, modules, max_bytes, probe, devices,
           jax_values, hash_name, codec,
           script, args):
    """Run SCRIPT [ARGS...] unmodified and record every operation into a trace.

    \b
    JAX: every jit call (its compiled outputs) and every jaxpr equation inside it
    (replayed from the call's real inputs), every eager primitive, every optax step.
    PyTorch: every aten op, forward and backward, and every optimizer step.

    The script's results are unchanged and its exit code is tracediff's. Options for
    tracediff go before SCRIPT; everything after SCRIPT is passed to the script.

    \b
    Examples:
      tracediff record -o a.h5 train.py --epochs 1
      XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 tracediff record -o b.h5 train.py --epochs 1
      tracediff record --level calls -o a.h5 train.py        # long run: cheap first pass
      tracediff record --level full --steps 31:32 -o a31.h5 train.py   # then zoom in
      tracediff record --probe '^train_step$' --steps 31:32 -o a31p.h5 train.py
    """
    from .capture import RecordOptions
    from .runner import output_path_for, record_script

    if not os.path.isfile(script):
        raise TraceError(f"{script}: no such script (give the path of a Python file: "
                         f"tracediff record -o trace.h5 train.py [ARGS...])")

    try:
        options = RecordOptions(level=level, loops=loops, steps=steps, ops=ops, modules=modules,
                               max_bytes=max_bytes, probe=probe, devices=devices,
                               jax_values=jax_values, codec=codec, hash=hash_name)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    written = output_path_for(output)
    at = os.path.abspath(written)   # fixed before the script runs: it may chdir
    code = record_script(script, list(args), output, options, frameworks or ("jax", "torch"))
    extra = f" (level {level}" + (f", steps {steps}" if steps else "") + \
        (f", {_sizes(at)}" if os.path.isfile(at) else "") + ")"
    if level == "full" and os.path.isfile(at):
        extra += _bytes_per_step(at)
    click.echo(f"tracediff: trace written to {written}{extra}", err=True)
    if code < 0:   # the plain script dies by this signal: so does record, trace written
        from .runner import exit_by_signal

        exit_by_signal(-code)
    sys.exit(code)


@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def info(trace, as_json):
    """Summarise TRACE: machine, packages, how the run ended, operation counts.

    \b
    Example:
      tracediff info a.h5
    """
    from .report.summary import trace_summary, print_summary

    from .trace.reader import Trace

    _need_trace(trace)

    with Trace(trace) as t:
        summary = trace_summary(t)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary)


@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.argument("event", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--npy", type=click.Path(dir_okay=False),
              help="Save the event's first output value to this .npy file.")
@click.option("--force", is_flag=True,
              help="Replace FILE when it is a symbolic link (the link, never what it points to).")
@_guard
def show(trace, event, as_json, npy, force):
    """Show EVENT (a number, as `locate` prints it) of TRACE: op, source line, inputs,
    and statistics of its values.

    \b
    Examples:
      tracediff show a.h5 375
      tracediff show a.h5 375 --npy out.npy    # then numpy.load("out.npy")
    """
    import numpy as np

    from .report.summary import event_detail, print_event
    from .trace.reader import Trace

    _need_trace(trace)

    with Trace(trace) as t:
        if not 0 <= event < len(t):
            raise TraceError(f"{trace}: no event {event} (the trace has {len(t)} events, "
                                 f"numbered 0 to {len(t) - 1})")
        detail, arrays = event_detail(t, event)
    if npy:
        if not arrays:
            raise TraceError(f"event {event} has no stored output value")
        from .outfile import open_output

        try:
            with open_output(npy, force) as fh:   # close() reports a full disk, e.g. /dev/full
                np.save(fh, arrays[0], allow_pickle=False)
        except OSError as exc:
            raise TraceError(f"cannot write {npy}: {exc.strerror or exc}") from None
    with _stdout():
        if as_json:
            click.echo(json.dumps(detail, indent=2, default=str))
        else:
            print_event(detail)


def _pool_options(fn):
    fn = click.option("--scheduler", default=None, metavar="ADDRESS",
                      help="Run the per-rank work on this Dask cluster (tcp://host:8786; "
                           "pip install 'tracediff-ml[dask]'); each task opens its traces "
                           "by path on the worker (docs/distributed.md).")(fn)
    fn = click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
                      help="Per-rank work on N local processes (default: one per CPU, at "
                           "most one per rank; 1: in this process).")(fn)
    return fn


@main.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path())
@click.argument("trace_b", type=click.Path(), required=False)
@_tolerance_options
@click.option("--map", "map_file", default=None, metavar="FILE|JSON",
              help="JSON {\"a module, name stack or op pattern\": \"b module, name stack or "
                   "op pattern\"}, inline or in a file, for traces of different frameworks: "
                   "the modules it names pair only with each other (e.g. --map "
                   "'{\"MLP/fc1\": \"fc1\"}'; at most 256 entries).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (see docs/reports.md).")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print source lines, per-output metrics, every optimizer step and every "
                   "environment difference.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; only the exit code tells.")
@_explain_options
@click.option("--no-explain", is_flag=True,
              help="Skip the replay verdict, the chain and the sources (no op is re-executed).")
@click.option("--no-sources", is_flag=True,
              help="Skip the sources of the difference (every op where one enters, ranked "
                   "by share; a few ops of each kind are re-executed).")
@_source_dir_option
@_pool_options
@_guard
def locate(trace_a, trace_b, rtol, atol, map_file, as_json, verbose, quiet, ulp, noise,
           no_explain, no_sources, source_dir, workers, scheduler):
    """Name the first operation where TRACE_A and TRACE_B disagree.

    Prints the first difference beyond tolerance (op, name stack, source line, step,
    metrics, whether it is introduced there or inherited from its inputs), the first
    bitwise difference, the optimizer steps and the environment differences.

    With one trace that recorded both JAX and PyTorch (a script that runs a Flax model
    and its torch port), its JAX side is a and its torch side b.

    With two directories (or quoted globs) of per-rank traces (`tracediff record -o
    run_a/` under torchrun), ranks are paired by the rank in their manifests, each pair
    is located (--workers local processes, or a Dask cluster with --scheduler) and the
    earliest divergence across ranks is reported: the rank where it started, and through
    which collective the others inherited it.

    \b
    Exit code: 0 match (within tolerance), 1 diverged, 2 error, 3 inconclusive: no
    divergence in what was compared, but too little was compared for a match (the
    coverage lines say what, and the next step).

    \b
    Examples:
      tracediff locate a.h5 b.h5
      tracediff locate a.h5 b.h5 --rtol 1e-4 --atol 1e-6
      tracediff locate a.h5 b.h5 --ulp 4 --noise a.h5 a_again.h5
      tracediff locate flax_and_torch.h5              # one script, both frameworks
      tracediff locate run_a/ run_b/                   # per-rank traces of two torchrun runs
      tracediff locate -q a.h5 b.h5 || echo "runs differ"
      NO_COLOR=1 tracediff locate a.h5 b.h5 > locate.txt
    """
    from .diff.locate import locate as _locate
    from .diff.distributed.ranks import is_rank_set

    if verbose and quiet:
        raise click.UsageError("--verbose and --quiet contradict each other; pick one")
    if is_rank_set(trace_a) or (trace_b is not None and is_rank_set(trace_b)):
        _locate_ranks(trace_a, trace_b, rtol, atol, map_file, as_json, verbose, quiet, ulp,
                      noise, no_explain, source_dir, workers, scheduler)
        return
    if workers is not None or scheduler is not None:
        raise click.UsageError("--workers and --scheduler apply to directories of per-rank "
                               "traces (tracediff locate DIR_A DIR_B)")
    map_file = _user_map(map_file)
    _need_trace(trace_a)
    if trace_b is not None:
        _need_trace(trace_b)
    for n in noise or ():
        _need_trace(n, "noise trace")
    with _Progress(quiet) as progress:
        result = _locate(trace_a, trace_b, rtol=rtol, atol=atol, map_file=map_file, ulp=ulp,
                         noise=noise or None, explain=not no_explain and not quiet,
                         progress=progress, sources=not no_sources)
    _print_result(result, as_json, verbose, quiet, source_dir)
    sys.exit(result.exit_code)


def _locate_ranks(trace_a, trace_b, rtol, atol, map_file, as_json, verbose, quiet, ulp,
                  noise, no_explain, source_dir, workers, scheduler):
    """`locate DIR_A DIR_B`: per-rank traces of two runs (diff/distributed/ranks.py)."""
    from .diff.distributed.ranks import locate_ranks

    if trace_b is None:
        raise click.UsageError("give two directories (or globs) of per-rank traces: "
                               "tracediff locate run_a/ run_b/")
    if map_file is not None or noise:
        raise click.UsageError("--map and --noise compare two single traces; not "
                               "directories of per-rank traces")
    for p in (trace_a, trace_b):
        if not os.path.exists(p) and not any(c in p for c in "*?["):
            raise TraceError(f"{p}: no such directory or trace file")
    rr = locate_ranks(trace_a, trace_b, rtol=rtol, atol=atol, ulp=ulp,
                      explain=not no_explain and not quiet, workers=workers,
                      scheduler=scheduler)
    if not quiet:
        for w in rr.result.warnings:
            click.echo(f"tracediff: warning: {printable(w)}", err=True)
        with _stdout():
            if as_json:
                from .report.json_report import ranks_build

                click.echo(json.dumps(ranks_build(rr), indent=2))
            else:
                from .report.ranks import print_ranks

                print_ranks(rr, verbose=verbose, source_dir=source_dir)
    sys.exit(rr.exit_code)


@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: verdict, first {device, rank, step, op, source, "
                   "event}, checked, departed, ...")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; only the exit code tells.")
@_pool_options
@_guard
def replicas(trace, as_json, quiet, workers, scheduler):
    """Check one run, with no reference: are the values that must be equal on every
    replica equal, and which rank or device departed first?

    TRACE is a directory (or quoted glob) of the per-rank traces of one data-parallel run
    (`tracediff record -o run/` under torchrun), or one trace with per-device values
    (a sharded JAX run). Compared: what replicated collectives deliver (all-reduce,
    broadcast, all-gather results) and everything computed only from them (averaged
    gradients, optimizer updates), across ranks; the replicas of a sharded value and
    per-device collective results, across devices.

    \b
    Exit code: 0 consistent, 1 diverged, 2 error or nothing to compare (never a pass:
    mixed world sizes or a missing rank are refused, no replicated value is not consistent).

    \b
    Examples:
      tracediff replicas run/
      tracediff replicas run/ --json
      tracediff replicas run/ --scheduler tcp://scheduler:8786
      tracediff replicas sharded.h5
    """
    from .diff.distributed.replicas import replicas as _replicas

    if not os.path.exists(trace) and not any(c in trace for c in "*?["):
        raise TraceError(f"{trace}: no such directory or trace file")
    result = _replicas(trace, workers=workers, scheduler=scheduler)
    if not quiet:
        with _stdout():
            if as_json:
                from .report.json_report import replicas_build

                click.echo(json.dumps(replicas_build(result), indent=2))
            else:
                from .report.ranks import print_replicas

                print_replicas(result)
    sys.exit(result.exit_code)


@main.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path())
@click.argument("trace_b", type=click.Path(), required=False)
@click.argument("event", type=int, required=False)
@_tolerance_options
@_explain_options
@click.option("--map", "map_file", default=None, metavar="FILE|JSON",
              help="Name map for traces of different frameworks, inline JSON or a JSON file "
                   "(as for locate).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="With directories of per-rank traces: explain this rank's pair (default: "
                   "the rank where the divergence started).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def explain(trace_a, trace_b, event, rtol, atol, ulp, noise, map_file, rank, as_json):
    """Explain a divergence: where it starts, how it grows, which machine is right, why.

    \b
    For the origin (EVENT of TRACE_A, or the op that introduced the first difference):
    - the chain through the dataflow to the first difference beyond tolerance and to
      the last outputs, with the amplification at each hop;
    - the replay verdict: the op re-executed here from each side's recorded inputs, in
      its own dtype (does this machine reproduce a or b?) and in higher precision
      (float64; numpy long double for float64 ops): how many ULP each side is off;
    - the environment differences that can change this kind of op, ranked;
    - per optimizer step, the largest relative difference of the parameters and loss.

    \b
    Exit code: 0 match, 1 diverged (as locate), 2 error, 3 inconclusive (as locate).

    \b
    Examples:
      tracediff explain a.h5 b.h5
      tracediff explain a.h5 b.h5 375 --json
      tracediff explain a.h5 b.h5 --noise a.h5 a_again.h5
      tracediff explain flax_and_torch.h5 [EVENT]      # one trace, both frameworks
      tracediff explain run_a/ run_b/ [--rank N]       # per-rank traces, as locate takes
    """
    from .diff.distributed.ranks import first_rank_pair, is_rank_set
    from .diff.locate import locate_with_analysis
    from .report.explain_terminal import print_analysis

    trace_b, event = _one_trace_event(trace_b, event)
    ranked = None   # (rank, its trace of a, of b): per-rank traces, that rank's pair explained
    if is_rank_set(trace_a) or (trace_b is not None and is_rank_set(trace_b)):
        if trace_b is None or map_file is not None or noise:
            raise click.UsageError("give two directories (or globs) of per-rank traces, "
                                   "without --map or --noise: tracediff explain run_a/ run_b/")
        for p in (trace_a, trace_b):
            if not os.path.exists(p) and not any(c in p for c in "*?["):
                raise TraceError(f"{p}: no such directory or trace file")
        ranked = first_rank_pair(trace_a, trace_b, rtol=rtol, atol=atol, ulp=ulp, rank=rank)
        _, trace_a, trace_b = ranked
    elif rank is not None:
        raise click.UsageError("--rank applies to directories of per-rank traces")
    map_file = _user_map(map_file)
    _need_trace(trace_a)
    if trace_b is not None:
        _need_trace(trace_b)
    for n in noise or ():
        _need_trace(n, "noise trace")
    with _Progress() as progress:
        result, analysis = locate_with_analysis(trace_a, trace_b, event, rtol=rtol, atol=atol,
                                                map_file=map_file, ulp=ulp,
                                                noise=noise or None, progress=progress)
    for w in result.warnings:
        click.echo(f"tracediff: warning: {printable(w)}", err=True)
    if as_json:
        from .report.json_report import analysis_json

        doc = analysis_json(analysis)
        if ranked is not None:
            doc = {"rank": ranked[0], **doc}
        click.echo(json.dumps(doc, indent=2))
    else:
        if ranked is not None:
            click.echo(f"rank {ranked[0]}: explaining its pair, {printable(trace_a)} against "
                       f"{printable(trace_b)}")
        print_analysis(analysis)
    sys.exit(result.exit_code)


@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.argument("event", type=int)
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR",
              help="Folder for repro.py and inputs.npz (created if needed).")
@click.option("--force", is_flag=True,
              help="Replace DIR/repro.py and DIR/inputs.npz when they exist (by default "
                   "tracediff refuses; it never writes through a symbolic link).")
@_guard
def repro(trace, event, out_dir, force):
    """Write a standalone reproducer of EVENT of TRACE: DIR/repro.py + DIR/inputs.npz.

    The script runs the op alone with its recorded inputs, with only numpy and the
    framework, and prints the result, its sha256 and whether it equals the recorded
    output: run it on both machines and attach it to the upstream bug report.

    \b
    Examples:
      tracediff repro b.h5 1 -o dot_repro && python dot_repro/repro.py
    """
    from .diff.explain.repro import write_repro

    _need_trace(trace)
    info = write_repro(trace, event, out_dir, force)
    click.echo(f"tracediff: reproducer of {printable(info['op'])} written to "
               f"{printable(info['script'])} (+ {os.path.basename(info['npz'])}); run: "
               f"{command('python', info['script'])}", err=True)


@main.command("slice", context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--around", "event", type=int, required=True, metavar="EVENT",
              help="The event to keep (e.g. the first difference locate names).")
@click.option("--hops", type=int, default=2, show_default=True,
              help="Keep the events within this many dataflow hops of EVENT, either way.")
@click.option("-o", "--output", required=True, metavar="FILE", help="The small trace to write.")
@click.option("--force", is_flag=True, help="Replace FILE when it exists.")
@_guard
def slice_command(trace, event, hops, output, force):
    """Write a small trace holding EVENT of TRACE, the events within --hops dataflow hops
    of it (its inputs' producers, its consumers), their enclosing calls, their values and
    source lines, and the manifest: small enough to attach to a bug report, and read by
    locate, explain, repro, show and report like any trace.

    \b
    Examples:
      tracediff slice a.h5 --around 375 -o a.small.h5
      tracediff slice b.h5 --around 375 -o b.small.h5
      tracediff locate a.small.h5 b.small.h5
    """
    from .trace.slice import write_slice

    _need_trace(trace)
    info = write_slice(trace, event, output, hops=hops, force=force)
    click.echo(f"tracediff: {printable(output)}: event {event} ({printable(info['op'])}) is "
               f"event {info['around']} of this slice; {info['events']} of {info['of_events']} "
               f"events, {fmt_bytes(info['size'])} (the trace: {fmt_bytes(info['of_size'])})",
               err=True)


def _one_trace_event(trace_b, event):
    """`explain TRACE EVENT` (one trace with both frameworks): the second argument is
    the event when it is a number and no such file exists."""
    if trace_b is not None and event is None and trace_b.isdigit() and \
            not os.path.exists(trace_b):
        return None, int(trace_b)
    return trace_b, event


def _report_format(output, fmt):
    if fmt:
        return fmt
    ext = os.path.splitext(output)[1].lower()
    if output == "-" or ext in (".md", ".markdown", ".txt"):
        return "md"
    if ext in (".html", ".htm"):
        return "html"
    raise TraceError(f"{output}: cannot tell the report format from the extension "
                     f"(use report.md or report.html, or give --format md|html)")


def write_report(trace_a, trace_b, output, fmt=None, rtol=None, atol=None, map_file=None,
                 source_dir=None, force=False):
    """Locate and write a Markdown/HTML report to `output` ('-' = stdout); returns the result.
    Code context is what trace a recorded (or read from `source_dir`, see --source-dir).
    `output` is never written through a symbolic link; `force` replaces the link."""
    from .outfile import check_link, open_output
    from .report.common import report_context

    fmt = _report_format(output, fmt)
    if output != "-":
        folder = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(folder):
            raise TraceError(f"cannot write {output}: folder {folder} does not exist")
        check_link(output, force)   # before the work
    if fmt == "html":
        from .diff.profile import locate_with_profile
        from .report.html import render

        result, profile = locate_with_profile(trace_a, trace_b, rtol, atol, map_file)
        text = render(result, report_context(result, source_dir), profile)
    else:
        from .diff.locate import locate as _locate
        from .report.markdown import render

        result = _locate(trace_a, trace_b, rtol=rtol, atol=atol, map_file=map_file)
        text = render(result, report_context(result, source_dir))
    if output == "-":
        click.echo(text, nl=False)
    else:
        try:
            with open_output(output, force) as fh:
                fh.write(text.encode("utf-8"))
        except OSError as exc:
            raise TraceError(f"cannot write {output}: {exc.strerror or exc}") from None
    return result


@main.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path(dir_okay=False))
@click.argument("trace_b", type=click.Path(dir_okay=False), required=False)
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE",
              help="report.md (Markdown), report.html (one self-contained page), "
                   "or - for Markdown on stdout.")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default=None,
              help="Format, when the extension of -o does not say.")
@_tolerance_options
@click.option("--map", "map_file", default=None, metavar="FILE|JSON",
              help="Name map for traces of different frameworks, inline JSON or a JSON file "
                   "(as for locate).")
@_source_dir_option
@click.option("--force", is_flag=True,
              help="Replace FILE when it is a symbolic link (the link, never what it points to).")
@_guard
def report(trace_a, trace_b, output, fmt, rtol, atol, map_file, source_dir, force):
    """Write a bug report comparing TRACE_A and TRACE_B (or the JAX and the torch side
    of one TRACE_A that recorded both).

    \b
    Markdown (-o report.md), made to paste into a GitHub issue: a summary paragraph,
    the culprit op with the user's source lines (as trace a recorded them; a local
    file only with --source-dir), metrics, the optimizer steps, the environment
    differences as a table, reproduction commands and the trace sizes to attach.
    HTML (-o report.html): the same in one page that needs no network, with plots
    of the difference per event along the run and per optimizer step (log scale),
    the culprit marked, and tables you can filter.

    \b
    Exit code: 0 when the report is written (whatever the verdict), 2 on error.

    \b
    Examples:
      tracediff report a.h5 b.h5 -o report.md
      tracediff report a.h5 b.h5 -o report.html --rtol 1e-4
      tracediff report a.h5 b.h5 | gh issue create --title "run diverges" --body-file -
    """
    map_file = _user_map(map_file)
    _need_trace(trace_a)
    if trace_b is not None:
        _need_trace(trace_b)
    result = write_report(trace_a, trace_b, output, fmt, rtol, atol, map_file, source_dir, force)
    if output != "-":
        click.echo(f"tracediff: {_report_format(output, fmt)} report written to {output} "
                   f"(verdict: {result.verdict})", err=True)


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.argument("golden", type=click.Path(dir_okay=False))
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@_tolerance_options
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Keep the new trace here (default: a temporary file, kept only when the "
                   "run diverges).")
@click.option("--update", is_flag=True,
              help="Record SCRIPT into GOLDEN (create or replace it) instead of comparing.")
@click.option("--report", "report_path", default=None, metavar="FILE",
              help="Also write a report (.md or .html), e.g. as a CI artifact.")
@click.option("--force", is_flag=True,
              help="Replace the --report FILE when it is a symbolic link (the link, never "
                   "what it points to).")
@click.option("--loops", type=click.Choice(["opaque", "stepped"]), default="opaque",
              show_default=True, help="As for record (use the golden's setting).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, as locate --json.")
@click.option("-v", "--verbose", is_flag=True, help="Longer report, as locate --verbose.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; only the exit code tells.")
@_guard
def check(golden, script, args, rtol, atol, output, update, report_path, force, loops, as_json,
          verbose, quiet):
    """Record SCRIPT [ARGS...] and compare it with the golden trace GOLDEN.

    For catching numerical drift in CI, e.g. after a library upgrade: store a
    golden trace once (--update), then run check in every build. tracediff's options
    go before GOLDEN; everything after SCRIPT is passed to the script. The script's
    own output goes to stderr, the report to stdout.

    \b
    Exit code: 0 match, 1 diverged, 2 error (including the script failing), 3
    inconclusive (too little compared, as locate).

    \b
    Examples:
      tracediff check --update goldens/train.h5 train.py --steps 2   # create
      tracediff check goldens/train.h5 train.py --steps 2            # compare
      tracediff check --rtol 1e-4 --report drift.html goldens/train.h5 train.py --steps 2
    """
    import contextlib
    import tempfile

    from .capture import RecordOptions
    from .runner import record_script

    if verbose and quiet:
        raise click.UsageError("--verbose and --quiet contradict each other; pick one")
    if script.endswith((".h5", ".hdf5")) or golden.endswith(".py"):
        raise TraceError("arguments in the wrong order: the golden trace comes first "
                         "(tracediff check GOLDEN.h5 SCRIPT.py [ARGS...])")
    if not os.path.isfile(script):
        raise TraceError(f"{script}: no such script (usage: tracediff check GOLDEN.h5 "
                         f"SCRIPT.py [ARGS...])")
    if not update:
        if not os.path.exists(golden):
            raise TraceError(f"{golden}: no such golden trace; create it with: "
                             f"{command('tracediff', 'check', '--update', golden, script, *args)}")
        from .diff.locate import nothing_to_compare

        why = nothing_to_compare(golden)   # a match against nothing would pass any run
        if why:
            raise TraceError(f"{golden}: the golden trace has nothing to compare ({why}); "
                             f"record it again: "
                             f"{command('tracediff', 'check', '--update', golden, script, *args)}")
    if report_path:
        _report_format(report_path, None)
        from .outfile import check_link

        check_link(report_path, force)   # refused before the script runs
    # fixed before the script runs (it may chdir); messages keep the names as given
    golden_at = os.path.abspath(golden)
    report_at = os.path.abspath(report_path) if report_path else None
    target = golden_at if update else (os.path.abspath(output) if output else None)
    tmp = None
    if target is None:
        fd, tmp = tempfile.mkstemp(prefix="tracediff-check-", suffix=".h5")
        os.close(fd)
        target = tmp
    with contextlib.redirect_stdout(sys.stderr):
        code = record_script(script, list(args), target, RecordOptions(loops=loops))
    if code != 0:
        if tmp:
            os.unlink(tmp)
        raise TraceError(f"{script} exited with status {code} while being recorded (its output "
                         f"is above); fix the script, or check it runs: "
                         f"{command('python', script, *args)}")
    if update:
        if not quiet:
            click.echo(f"tracediff: golden trace written to {golden}", err=True)
        sys.exit(0)
    from .diff.locate import locate as _locate

    try:
        result = _locate(golden_at, target, rtol=rtol, atol=atol)
        if report_path:
            write_report(golden_at, target, report_at, None, rtol, atol, force=force)
    except BaseException:
        if tmp:
            os.unlink(tmp)
        raise
    _print_result(result, as_json, verbose, quiet)
    if tmp and result.exit_code == 0:
        os.unlink(tmp)
    elif tmp and not quiet:
        click.echo(f"tracediff: the new trace is kept at {tmp} (compare or attach it; "
                   f"`tracediff check --update` accepts the new numbers)", err=True)
    if report_path and not quiet:
        click.echo(f"tracediff: report written to {report_path}", err=True)
    sys.exit(result.exit_code)


@main.command(context_settings=CONTEXT)
@click.option("--dir", "folder", default="tracediff-demo", show_default=True, metavar="DIR",
              help="Folder for the two traces.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="Training steps of the example.")
@_guard
def demo(folder, steps):
    """See tracediff work: record a bundled JAX example twice and locate the divergence.

    The two runs are on this machine: one plain, one with XLA's CPU code generation
    limited to SSE4.2 (as on an older CPU). Needs JAX, Flax and optax; about a minute.

    \b
    Example:
      tracediff demo --dir /tmp/demo && tracediff report /tmp/demo/a.h5 /tmp/demo/b.h5 -o r.html
    """
    from .demo import run_demo

    run_demo(folder, steps)


# One line each in `tracediff --help`.
for _cmd, _text in ((record, "Run a script unmodified and record every operation into a trace."),
                    (info, "Summarise a trace: machine, packages, end status, op counts."),
                    (show, "Show one event of a trace: op, source, inputs, values."),
                    (locate, "Name the first operation where two traces disagree."),
                    (explain, "Explain a divergence: origin, chain, replay verdict, causes."),
                    (repro, "Write a standalone script reproducing one recorded op."),
                    (slice_command, "Cut a trace down to one event and its neighbours (to attach)."),
                    (report, "Write a Markdown or HTML bug report comparing two traces."),
                    (check, "Record a script and compare it with a golden trace (CI)."),
                    (demo, "Record a bundled example twice and locate the divergence.")):
    _cmd.short_help = _text
