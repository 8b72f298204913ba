"""Command line: record, info, show, locate, demo. Bad input: one line on stderr, exit 2."""

import functools
import json
import os
import sys

import click

from . import __version__
from .errors import TraceError


def _guard(fn):
    """Turn TraceError (and unreadable input) into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TraceError as exc:
            click.echo(f"tracediff: error: {exc}", err=True)
            sys.exit(2)
        except BrokenPipeError:
            sys.exit(0)

    return wrapper


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tracediff")
def main():
    """Find the first operation where two runs of a numerical ML program disagree.

    \b
    On each machine:   tracediff record -o a.h5 train.py [ARGS...]
    Then:              tracediff locate a.h5 b.h5
    """


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.option("-o", "--output", default="trace.h5", show_default=True,
              help="Trace file to write (HDF5).")
@click.option("--loops", type=click.Choice(["opaque", "stepped"]), default="opaque",
              show_default=True, help="JAX while/scan: one event per loop, or one per iteration.")
@click.option("--framework", "frameworks", multiple=True, type=click.Choice(["jax", "torch"]),
              help="Capture only these frameworks (default: every one the script imports).")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@_guard
def record(output, loops, frameworks, script, args):
    """Run SCRIPT [ARGS...] unmodified and record every operation into a trace.

    JAX: every jit call (its real compiled outputs) and every jaxpr equation inside it
    (replayed from the call's real inputs), every eager primitive, every optax step.
    PyTorch: every aten op forward and backward, every optimizer step. The script's
    own results are unchanged; its exit code is tracediff's exit code.
    """
    from .capture import RecordOptions
    from .runner import record_script

    options = RecordOptions(loops=loops)
    code = record_script(script, list(args), output, options, frameworks or ("jax", "torch"))
    click.echo(f"tracediff: trace written to {output}", err=True)
    sys.exit(code)


@main.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def info(trace, as_json):
    """Show a trace's manifest, counts and per-operation summary."""
    from .report.summary import trace_summary, print_summary

    from .trace.reader import Trace

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
@_guard
def show(trace, event, as_json, npy):
    """Show one event's metadata, inputs and values."""
    import numpy as np

    from .report.summary import event_detail, print_event
    from .trace.reader import Trace

    with Trace(trace) as t:
        if not 0 <= event < len(t):
            raise TraceError(f"{trace}: no event {event} (the trace has {len(t)} events)")
        detail, arrays = event_detail(t, event)
    if npy:
        if not arrays:
            raise TraceError(f"event {event} has no stored output value")
        folder = os.path.dirname(os.path.abspath(npy))
        if not os.access(folder, os.W_OK):
            raise TraceError(f"cannot write {npy}")
        np.save(npy, arrays[0], allow_pickle=False)
    if as_json:
        click.echo(json.dumps(detail, indent=2, default=str))
    else:
        print_event(detail)


@main.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path(dir_okay=False))
@click.argument("trace_b", type=click.Path(dir_okay=False))
@click.option("--rtol", type=float, default=None,
              help="Relative tolerance for every floating dtype (default: per dtype).")
@click.option("--atol", type=float, default=None,
              help="Absolute tolerance for every floating dtype (default: per dtype).")
@click.option("--map", "map_file", type=click.Path(dir_okay=False), default=None,
              help="JSON file {\"a pattern\": \"b pattern\"} (globs over name stack, op, "
                   "or name_stack:op) pairing events the automatic alignment misses; implies "
                   "cross-framework pairing (used anyway when the frameworks differ).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def locate(trace_a, trace_b, rtol, atol, map_file, as_json):
    """Name the first operation where two traces disagree.

    \b
    Reports the first bitwise difference and the first difference beyond tolerance
    (op, name stack, source line, step, metrics, introduced here or inherited), then
    the environment differences. Exit code: 0 match, 1 diverged, 2 error.

    \b
    Default tolerances (rtol/atol): float64 1e-12/1e-14, float32 1e-5/1e-6,
    float16 1e-3/1e-4, bfloat16 1e-2/1e-3; integers, bools and keys exact.
    """
    from .diff.locate import locate as _locate

    result = _locate(trace_a, trace_b, rtol=rtol, atol=atol, map_file=map_file)
    for w in result.warnings:
        click.echo(f"tracediff: warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        from .report.terminal import print_locate

        print_locate(result)
    sys.exit(result.exit_code)


@main.command(context_settings=CONTEXT)
@click.option("--dir", "folder", default="tracediff-demo", show_default=True,
              help="Folder for the two traces.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="Training steps of the example.")
@_guard
def demo(folder, steps):
    """Record a bundled JAX example twice (plain, and with XLA limited to SSE4.2) and locate
    the first operation where the runs disagree."""
    from .demo import run_demo

    run_demo(folder, steps)
