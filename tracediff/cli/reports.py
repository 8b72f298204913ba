"""The commands that read a trace and write what it holds: `info` (a summary), `show` (one
event), `repro` (a standalone reproducer of one op), `slice` (a small trace around one
event) and `report` (a Markdown or HTML bug report comparing two traces; `check --report`
writes one too).
"""

import json
import os

import click

from ..errors import TraceError
from ..report.numbers import fmt_bytes
from ..shell import command
from ..untrusted import printable
from .shared import (CONTEXT, guard, need_trace, source_dir_option, tolerance_options,
                     to_stdout, user_map)


@click.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@guard
def info(trace, as_json):
    """Summarise TRACE: machine, packages, how the run ended, operation counts, and where
    its first NaN or Inf came from (the op that made it from finite inputs, how, and
    where Inf turned into NaN). TRACE may be a folder of one run's per-rank traces: each
    rank's origin, and the rank it started on.

    \b
    Examples:
      tracediff info a.h5
      tracediff info run_a/          # torchrun / jax.distributed: which rank first
    """
    from ..diff.distributed.ranks import is_rank_set, rank_traces
    from ..diff.nonfinite import find_nonfinite, find_nonfinite_ranks
    from ..report.json_report import nonfinite_json, nonfinite_ranks_json
    from ..report.nonfinite import markup_lines, nonfinite_lines, ranks_lines
    from ..report.summary import print_lines, trace_summary, print_summary
    from ..trace.reader import Trace

    if os.path.isdir(trace) or (not os.path.exists(trace) and is_rank_set(trace)):
        found = find_nonfinite_ranks(rank_traces(trace))
        if as_json:
            click.echo(json.dumps(nonfinite_ranks_json(found), indent=2))
        else:
            print_lines(markup_lines(ranks_lines(found)))
        return
    need_trace(trace)
    with Trace(trace) as t:
        summary = trace_summary(t)
        found = find_nonfinite(t)
    if as_json:
        summary["first_nonfinite"] = nonfinite_json(found)
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    print_summary(summary)
    print_lines(markup_lines(nonfinite_lines(found)) if found is not None else
                ["no NaN or Inf: every recorded value is finite"])


@click.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.argument("event", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--npy", type=click.Path(dir_okay=False),
              help="Save the event's first output value to this .npy file.")
@click.option("--force", is_flag=True,
              help="Replace FILE when it is a symbolic link (the link, never what it points to).")
@guard
def show(trace, event, as_json, npy, force):
    """Show EVENT (a number, as `locate` prints it) of TRACE: op, source line, inputs,
    and statistics of its values.

    \b
    Examples:
      tracediff show a.h5 375
      tracediff show a.h5 375 --npy out.npy    # then numpy.load("out.npy")
    """
    import numpy as np

    from ..report.summary import event_detail, print_event
    from ..trace.reader import Trace

    need_trace(trace)

    with Trace(trace) as t:
        if not 0 <= event < len(t):
            raise TraceError(f"{trace}: no event {event} (the trace has {len(t)} events, "
                                 f"numbered 0 to {len(t) - 1})")
        detail, arrays = event_detail(t, event)
    if npy:
        if not arrays:
            raise TraceError(f"event {event} has no stored output value")
        from ..outfile import open_output

        try:
            with open_output(npy, force) as fh:   # close() reports a full disk, e.g. /dev/full
                np.save(fh, arrays[0], allow_pickle=False)
        except OSError as exc:
            raise TraceError(f"cannot write {npy}: {exc.strerror or exc}") from None
    with to_stdout():
        if as_json:
            click.echo(json.dumps(detail, indent=2, default=str))
        else:
            print_event(detail)



@click.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.argument("event", type=int)
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR",
              help="Folder for repro.py and inputs.npz (created if needed).")
@click.option("--force", is_flag=True,
              help="Replace DIR/repro.py and DIR/inputs.npz when they exist (by default "
                   "tracediff refuses; it never writes through a symbolic link).")
@guard
def repro(trace, event, out_dir, force):
    """Write a standalone reproducer of EVENT of TRACE: DIR/repro.py + DIR/inputs.npz.

    The script runs the op alone with its recorded inputs, with only numpy and the
    framework, and prints the result, its sha256 and whether it equals the recorded
    output: run it on both machines and attach it to the upstream bug report.

    \b
    Examples:
      tracediff repro b.h5 1 -o dot_repro && python dot_repro/repro.py
    """
    from ..diff.explain.repro import write_repro

    need_trace(trace)
    info = write_repro(trace, event, out_dir, force)
    click.echo(f"tracediff: reproducer of {printable(info['op'])} written to "
               f"{printable(info['script'])} (+ {os.path.basename(info['npz'])}); run: "
               f"{command('python', info['script'])}", err=True)


@click.command("slice", context_settings=CONTEXT)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--around", "event", type=int, required=True, metavar="EVENT",
              help="The event to keep (e.g. the first difference locate names).")
@click.option("--hops", type=int, default=2, show_default=True,
              help="Keep the events within this many dataflow hops of EVENT, either way.")
@click.option("-o", "--output", required=True, metavar="FILE", help="The small trace to write.")
@click.option("--force", is_flag=True, help="Replace FILE when it exists.")
@guard
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
    from ..trace.slice import write_slice

    need_trace(trace)
    info = write_slice(trace, event, output, hops=hops, force=force)
    click.echo(f"tracediff: {printable(output)}: event {event} ({printable(info['op'])}) is "
               f"event {info['around']} of this slice; {info['events']} of {info['of_events']} "
               f"events, {fmt_bytes(info['size'])} (the trace: {fmt_bytes(info['of_size'])})",
               err=True)



def report_format(output, fmt):
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
                 source_dir=None, force=False, confirm=False):
    """Locate and write a Markdown/HTML report to `output` ('-' = stdout); returns the result.
    Code context is what trace a recorded (or read from `source_dir`, see --source-dir).
    `output` is never written through a symbolic link; `force` replaces the link."""
    from ..outfile import check_link, open_output
    from ..report.context import report_context

    fmt = report_format(output, fmt)
    if output != "-":
        folder = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(folder):
            raise TraceError(f"cannot write {output}: folder {folder} does not exist")
        check_link(output, force)   # before the work
    if fmt == "html":
        from ..diff.profile import locate_with_profile
        from ..report.html import render

        result, profile = locate_with_profile(trace_a, trace_b, rtol, atol, map_file)
        text = render(result, report_context(result, source_dir), profile)
    else:
        from ..diff.locate import locate as _locate
        from ..report.markdown import render

        result = _locate(trace_a, trace_b, rtol=rtol, atol=atol, map_file=map_file)
        text = render(result, report_context(result, source_dir))
    if confirm and trace_b is not None:   # each source checked by runs (diff/confirm/)
        from ..diff.confirm import confirm as _confirm
        from ..report import confirmation

        c = _confirm(trace_a, trace_b, located=result)
        if fmt == "html":
            text = text.replace("</main>", confirmation.html_section(c) + "</main>", 1)
        else:
            text += confirmation.markdown(c)
    if output == "-":
        click.echo(text, nl=False)
    else:
        try:
            with open_output(output, force) as fh:
                fh.write(text.encode("utf-8"))
        except OSError as exc:
            raise TraceError(f"cannot write {output}: {exc.strerror or exc}") from None
    return result


@click.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path(dir_okay=False))
@click.argument("trace_b", type=click.Path(dir_okay=False), required=False)
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE",
              help="report.md (Markdown), report.html (one self-contained page), "
                   "or - for Markdown on stdout.")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default=None,
              help="Format, when the extension of -o does not say.")
@tolerance_options
@click.option("--map", "map_file", default=None, metavar="FILE|JSON",
              help="Name map for traces of different frameworks, inline JSON or a JSON file "
                   "(as for locate).")
@source_dir_option
@click.option("--force", is_flag=True,
              help="Replace FILE when it is a symbolic link (the link, never what it points to).")
@click.option("--confirm", "with_confirm", is_flag=True,
              help="Also check each source by runs made here (tracediff confirm): the "
                   "measured removals beside the estimates, in a section of their own.")
@guard
def report(trace_a, trace_b, output, fmt, rtol, atol, map_file, source_dir, force,
           with_confirm):
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
      tracediff report a.h5 b.h5 -o report.md --confirm   # sources checked by runs
      tracediff report a.h5 b.h5 | gh issue create --title "run diverges" --body-file -
    """
    map_file = user_map(map_file)
    need_trace(trace_a)
    if trace_b is not None:
        need_trace(trace_b)
    result = write_report(trace_a, trace_b, output, fmt, rtol, atol, map_file, source_dir, force,
                          confirm=with_confirm)
    if output != "-":
        click.echo(f"tracediff: {report_format(output, fmt)} report written to {output} "
                   f"(verdict: {result.verdict})", err=True)
