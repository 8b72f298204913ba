"""`tracediff confirm`: the sources of a difference checked by counterfactual runs that
tracediff makes itself on this machine (`diff/confirm/`)."""

import json

import click

from .progress import ProgressBar
from .shared import CONTEXT, guard, need_trace, to_stdout


@click.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path())
@click.argument("trace_b", type=click.Path())
@click.option("--max-runs", type=click.IntRange(1, 200), default=16, show_default=True,
              help="At most this many runs (b as recorded first, then b without each "
                   "setting, then each setting alone).")
@click.option("--jobs", type=click.IntRange(1, 64), default=None, metavar="N",
              help="Runs at once (default: half the cores, at most 4).")
@click.option("--dir", "folder", default=None, metavar="DIR",
              help="Folder for the runs' traces and logs (default: a new temporary folder).")
@click.option("--dry-run", is_flag=True, help="Print the runs, make none.")
@click.option("--with", "given", multiple=True, type=click.Path(dir_okay=False), metavar="TRACE",
              help="A trace of b's script recorded elsewhere with a setting changed (b ran "
                   "on a TPU: the run confirm prints, made there); measured as a run. "
                   "Repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/json.md).")
@guard
def confirm(trace_a, trace_b, max_runs, jobs, folder, dry_run, given, as_json):
    """Check each source of the difference between TRACE_A and TRACE_B by re-running.

    Re-records b's script on this machine with each setting that differs (a numeric
    environment variable such as ATEN_CPU_CAPABILITY or ONEDNN_MAX_CPU_ISA, each XLA
    flag, the script's arguments) set as on a, one at a time, and with two or more, each
    setting alone. Prints, per source, locate's estimate beside the measured removal, the
    setting that removes or makes that op's difference (its cause, by experiment), and
    where settings interact. Runs only the script both traces ran (same sha256, at the
    recorded path); each run's command is printed exactly as run.

    Where b ran on an accelerator (a TPU), nothing is re-run here: confirm prints the
    commands to run there, and measures the traces given back with --with.

    \b
    Examples:
      tracediff confirm a.h5 b.h5
      tracediff confirm a.h5 b.h5 --dry-run       # the runs it would make
      tracediff confirm cpu.h5 tpu.h5 --with tpu_highest.h5   # a run made on the TPU
    """
    from ..diff.confirm import confirm as _confirm
    from ..report.confirmation import lines, to_json

    for path in (trace_a, trace_b, *given):
        need_trace(path)
    with ProgressBar(quiet=as_json) as progress:
        result = _confirm(trace_a, trace_b, workdir=folder, max_runs=max_runs, jobs=jobs,
                          progress=progress, dry_run=dry_run, given=given)
    with to_stdout():
        if as_json:
            click.echo(json.dumps(to_json(result), indent=2))
        else:
            for line in lines(result):
                click.echo(line)
