"""The commands that compare runs: `locate` (the first operation where two traces, or two
folders of per-rank traces, disagree), `replicas` (one data-parallel run checked against
itself) and `explain` (the origin of a divergence, its chain, the replay verdict).
"""

import json
import os
import sys

import click

from ..errors import TraceError
from ..untrusted import printable
from .progress import ProgressBar
from .shared import (CONTEXT, guard, need_trace, print_result, source_dir_option,
                     tolerance_options, to_stdout, user_map)


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



def _pool_options(fn):
    fn = click.option("--scheduler", default=None, metavar="ADDRESS",
                      help="Run the per-rank work on this Dask cluster (tcp://host:8786; "
                           "pip install 'tracediff-ml[dask]'); each task opens its traces "
                           "by path on the worker (docs/distributed.md).")(fn)
    fn = click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
                      help="Per-rank work on N local processes (default: one per CPU, at "
                           "most one per rank; 1: in this process).")(fn)
    return fn


@click.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path())
@click.argument("trace_b", type=click.Path(), required=False)
@tolerance_options
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
@source_dir_option
@_pool_options
@guard
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
    from ..diff.locate import locate as _locate
    from ..diff.distributed.ranks import is_rank_set

    if verbose and quiet:
        raise click.UsageError("--verbose and --quiet contradict each other; pick one")
    if is_rank_set(trace_a) or (trace_b is not None and is_rank_set(trace_b)):
        _locate_ranks(trace_a, trace_b, rtol, atol, map_file, as_json, verbose, quiet, ulp,
                      noise, no_explain, source_dir, workers, scheduler)
        return
    if workers is not None or scheduler is not None:
        raise click.UsageError("--workers and --scheduler apply to directories of per-rank "
                               "traces (tracediff locate DIR_A DIR_B)")
    map_file = _checked_inputs(map_file, trace_a, trace_b, noise)
    with ProgressBar(quiet) as progress:
        result = _locate(trace_a, trace_b, rtol=rtol, atol=atol, map_file=map_file, ulp=ulp,
                         noise=noise or None, explain=not no_explain and not quiet,
                         progress=progress, sources=not no_sources)
    print_result(result, as_json, verbose, quiet, source_dir)
    sys.exit(result.exit_code)


def _locate_ranks(trace_a, trace_b, rtol, atol, map_file, as_json, verbose, quiet, ulp,
                  noise, no_explain, source_dir, workers, scheduler):
    """`locate DIR_A DIR_B`: per-rank traces of two runs (diff/distributed/ranks.py)."""
    from ..diff.distributed.ranks import locate_ranks

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
        with to_stdout():
            if as_json:
                from ..report.json_report import ranks_build

                click.echo(json.dumps(ranks_build(rr), indent=2))
            else:
                from ..report.ranks import print_ranks

                print_ranks(rr, verbose=verbose, source_dir=source_dir)
    sys.exit(rr.exit_code)


@click.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: verdict, first {device, rank, step, op, source, "
                   "event}, checked, departed, ...")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; only the exit code tells.")
@_pool_options
@guard
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
    from ..diff.distributed.replicas import replicas as _replicas

    if not os.path.exists(trace) and not any(c in trace for c in "*?["):
        raise TraceError(f"{trace}: no such directory or trace file")
    result = _replicas(trace, workers=workers, scheduler=scheduler)
    if not quiet:
        with to_stdout():
            if as_json:
                from ..report.json_report import replicas_build

                click.echo(json.dumps(replicas_build(result), indent=2))
            else:
                from ..report.ranks import print_replicas

                print_replicas(result)
    sys.exit(result.exit_code)


@click.command(context_settings=CONTEXT)
@click.argument("trace_a", type=click.Path())
@click.argument("trace_b", type=click.Path(), required=False)
@click.argument("event", type=int, required=False)
@tolerance_options
@_explain_options
@click.option("--map", "map_file", default=None, metavar="FILE|JSON",
              help="Name map for traces of different frameworks, inline JSON or a JSON file "
                   "(as for locate).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="With directories of per-rank traces: explain this rank's pair (default: "
                   "the rank where the divergence started).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@guard
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
    from ..diff.distributed.ranks import first_rank_pair, is_rank_set
    from ..diff.locate import locate_with_analysis
    from ..report.explain_terminal import print_analysis

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
    map_file = _checked_inputs(map_file, trace_a, trace_b, noise)
    with ProgressBar() as progress:
        result, analysis = locate_with_analysis(trace_a, trace_b, event, rtol=rtol, atol=atol,
                                                map_file=map_file, ulp=ulp,
                                                noise=noise or None, progress=progress)
    for w in result.warnings:
        click.echo(f"tracediff: warning: {printable(w)}", err=True)
    if as_json:
        from ..report.json_report import analysis_json

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


def _one_trace_event(trace_b, event):
    """`explain TRACE EVENT` (one trace with both frameworks): the second argument is
    the event when it is a number and no such file exists."""
    if trace_b is not None and event is None and trace_b.isdigit() and \
            not os.path.exists(trace_b):
        return None, int(trace_b)
    return trace_b, event


def _checked_inputs(map_file, trace_a, trace_b, noise):
    """The --map read and every trace checked before any work (one-line errors, exit 2);
    returns the map."""
    map_file = user_map(map_file)
    need_trace(trace_a)
    if trace_b is not None:
        need_trace(trace_b)
    for n in noise or ():
        need_trace(n, "noise trace")
    return map_file
