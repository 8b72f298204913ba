"""`tracediff locate DIR_A DIR_B`: two multi-rank runs compared rank by rank, and which
rank went first.

The traces of each run (a directory, a glob, or one file) are paired by the rank in their
manifests (`distributed.rank`), each pair is located by the one engine (`locate.locate`,
on the pool of `distributed/pool.py`: in this process, a local process pool, or a Dask cluster), and
the per-rank first divergences are ordered: by optimizer step, then by position along the
collectives (every rank runs the same sequence of collectives, so "the k-th collective"
means the same exchange on each rank), and at the same position a divergence before a
collective comes before one that the collective itself delivers. Each rank's first
difference is the earliest of its structural difference (an op only one run has,
`align/structure.py`) and its first value difference of any size: a rank whose loss is off by a
few ULP went first even when only what the all-reduce delivers to the others is beyond
tolerance. The earliest is where it started; a rank whose first divergence is a
collective whose inputs still match received it from another rank through that collective.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Optional

import numpy as np

from ...errors import TraceError
from ...trace.collectives import (COLLECTIVE_PREFIX, FUNCOL_PREFIX, FUNCOL_WAIT, JAX_COLLECTIVES,
                                  is_collective)
from ...trace.reader import Trace
from . import pool
from ..locate import locate
from ..result import RankSummary, RanksResult, Spread

_FUNCOL_NOT_ISSUE = frozenset({FUNCOL_WAIT, "_c10d_functional::_wrap_tensor_autograd"})
_GLOB_CHARS = "*?["
_RANK_NAME = re.compile(r"(?:^|\.)rank(\d{1,6})\.h5$")


def is_rank_set(spec) -> bool:
    """Does this argument name a set of per-rank traces (a directory or a glob)?"""
    s = os.fspath(spec)
    return os.path.isdir(s) or any(c in s for c in _GLOB_CHARS)


def rank_traces(spec) -> dict:
    """{rank: path} of the traces a directory (its `*.h5`), a glob or one file names."""
    s = os.fspath(spec)
    if os.path.isdir(s):
        paths = sorted(glob.glob(os.path.join(glob.escape(s), "*.h5")))
        if not paths:
            raise TraceError(f"{s}: no traces (*.h5) in this directory")
    elif any(c in s for c in _GLOB_CHARS):
        paths = sorted(p for p in glob.glob(s) if os.path.isfile(p))
        if not paths:
            raise TraceError(f"{s}: no trace file matches")
    else:
        paths = [s]
    ranks, unranked = {}, []
    for p in paths:
        r = rank_in_name(p)
        if r is None:   # not named by `tracediff record`: the manifest says
            with Trace(p) as t:   # a file that is not a trace: a one-line TraceError
                r = t.rank
        if r is None:
            unranked.append(p)
        elif r in ranks:
            raise TraceError(f"{s}: two traces of rank {r}: {ranks[r]} and {p}")
        else:
            ranks[r] = p
    if unranked:
        if ranks or len(unranked) > 1:
            raise TraceError(f"{unranked[0]}: no rank in its manifest (not recorded under "
                             f"torchrun / a launcher); put each run's per-rank traces in "
                             f"their own directory")
        ranks[0] = unranked[0]
    return ranks


def rank_in_name(path) -> Optional[int]:
    """R of a file named as `tracediff record` names per-rank traces (`rank{R}.h5`,
    `NAME.rank{R}.h5`), else None. Pairing trusts the name (opening every trace to read
    its manifest costs more than comparing small ones); the task that opens the file
    checks the manifest agrees (`check_rank_of`)."""
    m = _RANK_NAME.search(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def check_rank_of(t: Trace, rank: int):
    """A trace named as rank R must say rank R in its manifest."""
    if t.rank is not None and t.rank != rank:
        raise TraceError(f"{t.path}: named as rank {rank}, but its manifest says rank {t.rank}")
    if t.rank is None and rank_in_name(t.path) is not None:
        raise TraceError(f"{t.path}: named as rank {rank}, but its manifest names no rank")


def pair_ranks(spec_a, spec_b) -> list:
    """[(rank, path_a, path_b)] by rank; both sides must hold the same ranks."""
    a, b = rank_traces(spec_a), rank_traces(spec_b)
    if set(a) != set(b):
        raise TraceError(f"the runs hold different ranks: {os.fspath(spec_a)} has "
                         f"{_ranks_text(a)}, {os.fspath(spec_b)} has {_ranks_text(b)}")
    return [(r, a[r], b[r]) for r in sorted(a)]


def _ranks_text(d):
    rs = sorted(d)
    if rs and rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}-{rs[-1]}"
    return "rank" + ("s " if len(rs) != 1 else " ") + ", ".join(map(str, rs))


def _issues(op: str) -> bool:
    """An op that starts one exchange: `c10d::*`, or a functional collective's issue."""
    return op.startswith(COLLECTIVE_PREFIX) or (
        op.startswith(FUNCOL_PREFIX) and op not in _FUNCOL_NOT_ISSUE)


def collectives_before(t: Trace, index: int) -> int:
    """How many collectives (`c10d::*` events; JAX collective equations, counted on one
    device of the process, since each is replayed once per device) trace t holds before
    event `index`."""
    ops = np.asarray(t.events["op"][:index])
    if not len(ops):
        return 0
    ids = [int(i) for i in np.unique(ops)]
    torch = [i for i in ids if _issues(t.string(i))]
    jax = [i for i in ids if t.string(i) in JAX_COLLECTIVES]
    n = int(np.isin(ops, torch).sum()) if torch else 0
    if jax:
        at = np.flatnonzero(np.isin(ops, jax))
        devs = [t.event_device(int(e)) for e in at]
        n += sum(1 for d in devs if d == devs[0])
    return n


def locate_pair(rank: int, path_a: str, path_b: str, options: dict) -> tuple:
    """(RankSummary, LocateResult) of one rank's pair; runs where `pool.run` puts it and
    opens both files by path there."""
    with Trace(path_a) as ta, Trace(path_b) as tb:
        check_rank_of(ta, rank)
        check_rank_of(tb, rank)
        result = locate(ta, tb, **options)
        st = result.structural
        if st is not None and st.first:
            # an op only one run has, before any value differs: where this rank departs
            e = st.event
            return RankSummary(
                rank=rank, path_a=path_a, path_b=path_b, verdict=result.verdict,
                index=e.index, op=e.op, source=e.source, name_stack=e.name_stack, step=e.step,
                device=getattr(e, "device", "") or "", inputs_match=True,
                collective=collectives_before(ta if st.side == "a" else tb, e.index),
                at_collective=e.op.startswith(COLLECTIVE_PREFIX), structural=st.text,
                **_shard_of(ta if st.side == "a" else tb, e.index)), result
        # the first difference of any size: a rank whose values part by a few ULP before
        # a collective went first, even if only what the collective delivers is beyond
        # tolerance on the others
        f = result.first_difference or result.first_beyond_tolerance
        if f is None:
            return RankSummary(rank=rank, path_a=path_a, path_b=path_b,
                               verdict=result.verdict), result
        e = f.a
        summary = RankSummary(
            rank=rank, path_a=path_a, path_b=path_b, verdict=result.verdict, index=e.index,
            op=e.op, source=e.source, name_stack=e.name_stack, step=e.step,
            device=getattr(e, "device", "") or "", inputs_match=f.inputs_match,
            collective=collectives_before(ta, e.index),
            at_collective=is_collective(e.op), collective_op=_exchange(ta, e.index, e.op),
            **_shard_of(ta, e.index))
    return summary, result


def _exchange(t: Trace, index: int, op: str) -> str:
    """The collective an event at a collective stands for: itself, or for a functional
    collective's `wait_tensor` the op that issued it (its input's producer)."""
    if op != FUNCOL_WAIT:
        return op if is_collective(op) else ""
    rows = t.input_rows(index)
    p = int(rows[0]["producer"]) if len(rows) else -1
    issued = t.string(t.events[p]["op"]) if 0 <= p < len(t) else ""
    return issued if issued.startswith(FUNCOL_PREFIX) else op


def _shard_of(t: Trace, index: int) -> dict:
    """{"param", "shard"} of an event whose output is a DTensor parameter's local shard
    (the `placements` table), else {}."""
    pl = t.placement(index)
    if pl is None:
        return {}
    where = f"offset {pl['offset'] or '0'} of {pl['global_shape']} ({pl['placements']}" + \
        (f", mesh {pl['mesh']} at {pl['coord']})" if pl["coord"] else ")")
    return {"param": pl["param"] or "", "shard": where}


def _order(s: RankSummary):
    """Earliest first: step, collectives before it, before rather than at a collective."""
    return (s.step if s.step is not None else 1 << 62, s.collective or 0,
            1 if s.at_collective else 0, s.rank)


def locate_ranks(a, b, rtol: Optional[float] = None, atol: Optional[float] = None,
                 ulp: Optional[float] = None, explain: bool = True,
                 workers: Optional[int] = None, scheduler=None) -> RanksResult:
    """Python API: compare two multi-rank runs (directories, globs or files of per-rank
    traces) rank by rank; `workers` / `scheduler` say where the per-rank work runs
    (`distributed/pool.py`)."""
    pairs = pair_ranks(a, b)
    options = {"rtol": rtol, "atol": atol, "ulp": ulp, "explain": explain}
    jobs = [(r, os.path.abspath(pa), os.path.abspath(pb), options) for r, pa, pb in pairs]
    return combine(pool.run(locate_pair, jobs, workers=workers, scheduler=scheduler))


def first_rank_pair(a, b, rtol: Optional[float] = None, atol: Optional[float] = None,
                    ulp: Optional[float] = None, rank: Optional[int] = None,
                    workers: Optional[int] = None) -> tuple:
    """(rank, path_a, path_b) for `tracediff explain DIR_A DIR_B`: the pair of the rank
    where the divergence started (`locate_ranks`, without replays), or of `rank`."""
    pairs = pair_ranks(a, b)
    if rank is None:
        rr = locate_ranks(a, b, rtol=rtol, atol=atol, ulp=ulp, explain=False, workers=workers)
        rank = rr.first_rank if rr.first_rank is not None else pairs[0][0]
    found = [(r, pa, pb) for r, pa, pb in pairs if r == rank]
    if not found:
        raise TraceError(f"no rank {rank} in these runs (they hold {_ranks_text(dict((r, pa) for r, pa, _ in pairs))})")
    return found[0]


def combine(done) -> RanksResult:
    """The `RanksResult` of the per-rank `locate_pair` results (in rank order): the
    earliest divergence, and how it reached the other ranks."""
    summaries = [s for s, _ in done]
    results = {s.rank: res for s, res in done}
    if not any(s.verdict == "diverged" for s in summaries):
        # a rank compared on too little evidence makes the whole run inconclusive
        thin = [s for s in summaries if s.verdict == "inconclusive"]
        return RanksResult(verdict="inconclusive" if thin else "match", ranks=summaries,
                           result=results[(thin or summaries)[0].rank])
    # ordered by each rank's first difference (structural or value, any size): the rank
    # that departed first, then those that received it
    diverged = sorted((s for s in summaries if s.index is not None), key=_order)
    first = diverged[0]
    spread, note = [], ""
    for s in diverged[1:]:
        via = (s.collective_op or s.op) if s.at_collective and s.inputs_match is not False \
            else None
        spread.append(Spread(rank=s.rank, step=s.step, op=s.op, via=via,
                             collective=s.collective if via else None, source=s.source,
                             device=s.device or ""))
    if first.at_collective and first.inputs_match:
        note = (f"rank {first.rank} first differs at a collective ({first.op}) whose inputs "
                f"match: the collective's own result differs (a nondeterministic reduction, "
                f"or a fault inside the exchange)")
    return RanksResult(verdict="diverged", ranks=summaries, result=results[first.rank],
                       first_rank=first.rank, spread=spread, note=note)
