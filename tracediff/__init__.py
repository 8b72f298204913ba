"""tracediff: find the first operation where two runs of a numerical ML program disagree.

Pipeline: capture (per framework) -> trace (one versioned HDF5 file) -> diff (align,
compare, locate) -> report (terminal, JSON, Markdown, HTML). `locate` returns a typed
`LocateResult` (`tracediff.diff.result`); every renderer takes that one object.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from ._version import __version__

if TYPE_CHECKING:  # the types only: `import tracediff` stays cheap
    from .diff.result import LocateResult, RanksResult, ReplicasResult
    from .trace.reader import Trace

_PathOrTrace = Union[str, "os.PathLike[str]", "Trace"]


def load(path: Union[str, "os.PathLike[str]"]) -> "Trace":
    """Open a trace file read-only (no code in it is ever executed); returns a `Trace`.

    `t.manifest` (dict), `len(t)` events, `t.events_table()` (dict of numpy columns with
    strings resolved: `pandas.DataFrame(t.events_table())`), `t.event(i)` (one event as a
    dict), `t.outputs(i)` (its output values as numpy arrays). Use as a context manager
    or call `t.close()`.
    """
    from .trace.reader import Trace

    return Trace(path)


def locate(a: _PathOrTrace, b: Optional[_PathOrTrace] = None, rtol: Optional[float] = None,
           atol: Optional[float] = None, map_file: Optional[str] = None,
           ulp: Optional[float] = None, noise: Optional[Sequence[_PathOrTrace]] = None,
           explain: bool = True, progress: Optional[Callable] = None,
           sources: bool = True) -> "LocateResult":
    """Compare two traces (paths or open traces); returns a `LocateResult`. With `b`
    None, `a` is one trace that recorded both JAX (side a) and PyTorch (side b).

    `result.verdict` ("match" / "diverged"), `result.exit_code` (0 / 1, as the CLI),
    `result.first_difference` and `result.first_beyond_tolerance` (`Finding` or None:
    `.a`/`.b` the events (`EventRef`: op, name_stack, source, step; also readable as
    `.a["op"]`); `.metrics` (`Metrics`, real floats); `.inputs_match`),
    `result.env_diff`, `result.optimizer_steps`; `tracediff.to_json(result)` is exactly what
    `tracediff locate --json` prints. `rtol`/`atol` override the per-dtype tolerances;
    `ulp=N` accepts elements N ULP apart; `noise=(a1, a2)` (two traces from a's machine)
    never blames events that differ between them; `map_file` is the module map of two
    frameworks (a JSON file, inline JSON, or a dict; as `--map`); `explain` adds `result.explain` (the
    replay verdict of the origin), `result.chain` (origin to outputs) and, with `sources`,
    `result.sources` (every source of the difference, ranked by estimated share);
    `progress(phase, done, total)` is called as the work goes (the CLI draws its progress
    bar from it)."""
    from .diff.locate import locate as _locate

    return _locate(a, b, rtol=rtol, atol=atol, map_file=map_file, ulp=ulp, noise=noise,
                   explain=explain, progress=progress, sources=sources)


def locate_ranks(a, b, rtol: Optional[float] = None, atol: Optional[float] = None,
                 ulp: Optional[float] = None, explain: bool = True,
                 workers: Optional[int] = None, scheduler=None) -> "RanksResult":
    """Compare two multi-rank runs (directories or globs of per-rank traces) rank by rank,
    as `tracediff locate DIR_A DIR_B`; returns a `RanksResult`: `first_rank`, `ranks`
    (`RankSummary` per rank), `spread` (how the divergence reached the other ranks), and
    `result`, the first rank's `LocateResult`. `workers`: local processes (1: this
    process); `scheduler`: a Dask scheduler address or `distributed.Client`."""
    from .diff.distributed.ranks import locate_ranks as _locate_ranks

    return _locate_ranks(a, b, rtol=rtol, atol=atol, ulp=ulp, explain=explain,
                         workers=workers, scheduler=scheduler)


def replicas(run, workers: Optional[int] = None, scheduler=None) -> "ReplicasResult":
    """Check one run's replicas with no reference, as `tracediff replicas`: a directory or
    glob of per-rank traces, or one trace with per-device values; returns a
    `ReplicasResult` (`verdict` "consistent" / "diverged" / "nothing_to_compare" (nothing compared),
    `first`: rank, device, step, op, source, event of the first copy that departs)."""
    from .diff.distributed.replicas import replicas as _replicas

    return _replicas(run, workers=workers, scheduler=scheduler)


def to_json(result) -> dict:
    """The JSON form (plain dicts and lists) of a `LocateResult`, `RanksResult` or
    `ReplicasResult`: exactly what `tracediff locate --json` / `tracediff replicas --json`
    print."""
    from .diff.result import RanksResult, ReplicasResult
    from .report.json_report import build, ranks_build, replicas_build

    if isinstance(result, RanksResult):
        return ranks_build(result)
    if isinstance(result, ReplicasResult):
        return replicas_build(result)
    return build(result)


def __getattr__(name):
    # `tracediff.record` is imported lazily: `import tracediff` stays cheap.
    if name == "record":
        from .api import record

        return record
    raise AttributeError(f"module 'tracediff' has no attribute {name!r}")
