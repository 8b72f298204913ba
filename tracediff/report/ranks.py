"""Terminal rendering of the many-rank results: `tracediff locate DIR_A DIR_B` (a
`RanksResult`: where the divergence started, how it spread, every rank's summary, then the
first rank's full locate report) and `tracediff replicas` (a `ReplicasResult`).

Every string from a trace (ops, sources, paths) goes through `untrusted.markup`.
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console

from ..diff.result import RanksResult, ReplicasResult
from ..untrusted import markup
from .findings import typed


def _console(console):
    return console or Console(highlight=False, soft_wrap=True, emoji=False)


def _where(s) -> str:
    dev = f" on {markup(s.device)}" if getattr(s, "device", "") else ""
    shard = ""
    if getattr(s, "shard", ""):   # one rank's local shard of a DTensor (parameter)
        shard = (f", parameter [bold]{markup(s.param)}[/]" if getattr(s, "param", "") else
                 ", DTensor") + f" shard at {markup(s.shard)}"
    return (f"[bold]{markup(s.op)}[/]{dev} step {markup(s.step)}"
            f"{'  ' + markup(s.source) if s.source else ''}{shard}")


def print_ranks(rr: RanksResult, console: Optional[Console] = None, verbose: bool = False,
                source_dir: Optional[str] = None) -> None:
    """Print a many-rank comparison: the headline, the spread, the per-rank table, then
    the first rank's locate report (`terminal.print_locate`)."""
    from .terminal import print_locate

    typed(rr, RanksResult)
    console = _console(console)
    n = len(rr.ranks)
    if rr.verdict == "match":
        console.print(f"[bold green]MATCH[/]: {n} rank{'s' if n != 1 else ''} compared, "
                      f"no divergence beyond tolerance")
    elif rr.verdict == "inconclusive":
        thin = [str(s.rank) for s in rr.ranks if s.verdict == "inconclusive"]
        console.print(f"[bold yellow]INCONCLUSIVE[/]: {n} rank{'s' if n != 1 else ''} "
                      f"compared, no divergence beyond tolerance, but too little was compared "
                      f"on rank{'s' if len(thin) != 1 else ''} {markup(', '.join(thin))} (exit "
                      f"code 3)")
    else:
        first = next(s for s in rr.ranks if s.rank == rr.first_rank)
        how = {True: "introduced there", False: "inherited from its inputs",
               None: "inputs unknown"}[first.inputs_match]
        console.print(f"[bold red]DIVERGED[/]: {n} ranks compared; it started on "
                      f"[bold]rank {markup(first.rank)}[/]: {_where(first)} ({how})")
        for sp in rr.spread:
            on = f" on {markup(sp.device)}" if sp.device else ""
            if sp.via:
                console.print(f"  rank {markup(sp.rank)}{on} inherited it through "
                              f"[bold]{markup(sp.via)}[/] (collective #{markup(sp.collective)}, "
                              f"step {markup(sp.step)}{', ' + markup(sp.source) if sp.source else ''})")
            else:
                console.print(f"  rank {markup(sp.rank)}{on} diverged on its own at "
                              f"{markup(sp.op)} step {markup(sp.step)}"
                              f"{'  ' + markup(sp.source) if sp.source else ''}")
        if rr.note:
            console.print(f"  note: {markup(rr.note)}")
    console.print("ranks:")
    for s in rr.ranks:
        if s.verdict != "diverged" and (s.index is None or rr.verdict != "diverged"):
            console.print(f"  rank {markup(s.rank):>3}  {markup(s.verdict)}")
            continue
        kind = "at collective" if s.at_collective else "after collective"
        small = ", within tolerance" if s.verdict != "diverged" else ""
        console.print(f"  rank {markup(s.rank):>3}  {_where(s)}  (event #{markup(s.index)}, "
                      f"{kind} #{markup(s.collective)}{small})")
    console.print(f"[dim]--- rank {markup(rr.first_rank if rr.first_rank is not None else rr.ranks[0].rank)}"
                  f" in full ---[/]")
    print_locate(rr.result, console=console, verbose=verbose, source_dir=source_dir)


def print_replicas(r: ReplicasResult, console: Optional[Console] = None) -> None:
    """Print a replica check: consistent, or the first departure."""
    typed(r, ReplicasResult)
    console = _console(console)
    across = (f"{len(r.ranks)} ranks (reference rank {markup(r.reference_rank)})"
              if r.ranks else "the devices of one trace")
    if r.verdict == "consistent":
        console.print(f"[bold green]CONSISTENT[/]: {markup(r.checked)} replicated values "
                      f"compared across {across}; every copy is bitwise equal")
    elif r.verdict == "nothing_to_compare":
        console.print(f"[bold yellow]NOTHING TO COMPARE[/]: no replicated value across "
                      f"{across}; nothing was checked")
    else:
        f = r.first
        who = (f"device {markup(f.device)}" + (f" of rank {markup(f.rank)}" if f.rank is not None
                                                else "")) if f.device else f"rank {markup(f.rank)}"
        console.print(f"[bold red]DIVERGED[/]: replicas part on [bold]{who}[/] at "
                      f"[bold]{markup(f.op)}[/] ({markup(f.phase)}) step {markup(f.step)}"
                      f"{'  ' + markup(f.source) if f.source else ''}  (event #{markup(f.event)})")
        if f.name_stack:
            console.print(f"  module: {markup(f.name_stack)}")
        if r.departed:
            console.print(f"  ranks whose copy differs there: "
                          f"{', '.join(markup(x) for x in r.departed)}")
        if r.devices:
            console.print(f"  devices whose copy differs there: "
                          f"{', '.join(markup(x) for x in r.devices)}")
        console.print(f"  {markup(r.checked)} replicated values compared across {across}")
    if r.note:
        console.print(f"  note: {markup(r.note)}")
