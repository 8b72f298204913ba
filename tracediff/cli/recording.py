"""The commands that run a script under recording: `record` (a trace of one run, and what
it cost per step) and `check` (record, then compare with a golden trace, for CI).
"""

import os
import sys

import click

from ..errors import TraceError
from ..report.numbers import fmt_bytes
from ..shell import command
from .reports import report_format, write_report
from .shared import CONTEXT, guard, print_result, tolerance_options


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



@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
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
@guard
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
    from ..capture import RecordOptions
    from ..runner.output import output_path_for
    from ..runner.script import record_script

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
        from ..runner.signals import exit_by_signal

        exit_by_signal(-code)
    sys.exit(code)


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.argument("golden", type=click.Path(dir_okay=False))
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@tolerance_options
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
@guard
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

    from ..capture import RecordOptions
    from ..runner.script import record_script

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
        from ..diff.locate import nothing_to_compare

        why = nothing_to_compare(golden)   # a match against nothing would pass any run
        if why:
            raise TraceError(f"{golden}: the golden trace has nothing to compare ({why}); "
                             f"record it again: "
                             f"{command('tracediff', 'check', '--update', golden, script, *args)}")
    if report_path:
        report_format(report_path, None)
        from ..outfile import check_link

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
        # SIGTERM: an error and the temporary trace removed, not a death where the script is
        code = record_script(script, list(args), target, RecordOptions(loops=loops),
                             sigterm_ends_process=False)
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
    from ..diff.locate import locate as _locate

    try:
        result = _locate(golden_at, target, rtol=rtol, atol=atol)
        if report_path:
            write_report(golden_at, target, report_at, None, rtol, atol, force=force)
    except BaseException:
        if tmp:
            os.unlink(tmp)
        raise
    print_result(result, as_json, verbose, quiet)
    if tmp and result.exit_code == 0:
        os.unlink(tmp)
    elif tmp and not quiet:
        click.echo(f"tracediff: the new trace is kept at {tmp} (compare or attach it; "
                   f"`tracediff check --update` accepts the new numbers)", err=True)
    if report_path and not quiet:
        click.echo(f"tracediff: report written to {report_path}", err=True)
    sys.exit(result.exit_code)
