"""`tracediff replicas TRACE_OR_DIR`: one run, no reference: do the values that must be
equal on every replica agree, and which rank or device departed first?

Across ranks (a directory or glob of per-rank traces of one data-parallel run): what a
replicated collective delivers (`c10d::allreduce_`, `broadcast_`, `allgather_`: every
rank of the group receives the same result) is equal on every rank by definition, and so
is everything computed from only such values (DDP's averaged gradients copied into
`.grad`, the parameters DDP broadcast at the start, the optimizer's updates of them;
a snapshot of memory that such an op wrote last). The lowest rank's trace is the
reference: its events are marked replicated along the dataflow from those collectives,
each other rank is aligned with it by the one engine (`Differ`) and the replicated events
are compared bitwise (their content hashes). The earliest replicated event where a rank's
copy differs names the rank, step, op and source line; when every other rank agrees
against the reference, the reference is the one that departed (with two ranks it cannot
be told: the other rank is named). Each rank's check runs where `distributed/pool.py` puts it,
opening its files there.

Within one trace (JAX, `Trace.device_values`): the copies of one value that a sharding
replicates (same shard index, several replicas) must be bitwise equal, and so must the
per-device results of a replicated collective (`psum`, `pmean`, `all_gather`, `pmax`,
`pmin` replayed per device) and of every per-device op computed only from such results
and constants (grouped across devices by call, step, op, line and occurrence). The
earliest event where a device's copy differs names it, descending from a call (or a
`shard_map` equation) whose replicas differ into the op inside it that departed: a
replicated op that differs there, else the first op of that device in the body that
reads a replicated value and whose result is not what most devices got (a per-device
update after the all-reduce also reads `axis_index`, so it is not itself replicated).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Optional

import numpy as np

from ...errors import TraceError
from ...trace import schema
from ...trace.reader import Trace
from . import pool
from .ranks import check_rank_of, is_rank_set, rank_traces
from ..result import ReplicaDeparture, ReplicasResult

# collectives whose result is the same on every rank of the group
REPLICATED_COLLECTIVES = ("c10d::allreduce_", "c10d::broadcast_", "c10d::allgather_",
                          "c10d::_allgather_base_", "c10d::allreduce_coalesced_",
                          "c10d::allgather_into_tensor_coalesced_",
                          "c10d::allgather_coalesced_")
# ops that overwrite their first argument: its old value does not matter
OVERWRITE_OPS = ("aten::copy_",)
JAX_REPLICATED = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum2")
# across the processes of a jax.distributed run, also the check_vma forms
JAX_ACROSS = JAX_REPLICATED + ("psum_invariant", "all_gather_invariant")
NOTHING = "nothing_to_compare"
MAX_DEPARTURES = 50


def replicated_mask(t: Trace) -> np.ndarray:
    """Bool per event of t: its outputs must be equal on every rank (a replicated
    collective, or an op whose every input is such a value or a constant)."""
    n = len(t.events)
    ops = t.events["op"]
    names = {int(i): t.string(int(i)) for i in np.unique(ops)}
    seeds = [i for i, s in names.items() if s in REPLICATED_COLLECTIVES]
    rep = np.zeros(n, bool)
    if not seeds:
        return rep
    overwrite = {i for i, s in names.items() if s in OVERWRITE_OPS}
    seeds = set(seeds)
    inp = t.inputs
    order = np.argsort(inp["event"], kind="stable")
    ev, prod, slot = inp["event"][order], inp["producer"][order], inp["slot"][order]
    bounds = np.searchsorted(ev, np.arange(n + 1))
    kind, parents = t.events["kind"], t.events["parent"]
    first_seed = int(np.flatnonzero(np.isin(ops, list(seeds)))[0])
    for e in range(first_seed, n):
        op = int(ops[e])
        if op in seeds:
            rep[e] = True
            continue
        if kind[e] == schema.KIND_INPUT:
            # a snapshot of memory whose last writer was replicated (a parameter that
            # DDP's broadcast wrote, read through another alias)
            p = int(parents[e])
            rep[e] = 0 <= p < e and rep[p]
            continue
        if kind[e] != schema.KIND_OP:
            continue
        lo, hi = bounds[e], bounds[e + 1]
        if hi == lo:
            continue
        ps = prod[lo:hi]
        if op in overwrite:
            ps = ps[slot[lo:hi] != 0]
        known = ps[(ps >= 0) & (ps < e)]
        constants = (ps == schema.PRODUCER_LITERAL) | (ps == schema.PRODUCER_CONST)
        if len(known) and len(known) + int(constants.sum()) == len(ps) and rep[known].all():
            rep[e] = True
    return rep


def jax_replicated_mask(t: Trace) -> np.ndarray:
    """Bool per event of t, one process of a jax.distributed run: its outputs must be
    equal on every process. A global array replicated over devices of several processes
    (each stored it whole, its shards rows whole copies), the per-device result of a
    replicated collective in a `shard_map` body replayed per device, and a body equation
    computed only from such values and constants. All False for a single process."""
    n = len(t.events)
    rep = np.zeros(n, bool)
    d = t.manifest.get("distributed")
    count = d.get("process_count") if isinstance(d, dict) else None
    if not isinstance(count, int) or count < 2 or not t.has_devices():
        return rep
    sh = t.shard_rows
    whole = [i for i in np.unique(sh["index"]) if t.string(int(i)) == ""]
    sel = (sh["role"] == schema.ROLE_OUT) & np.isin(sh["index"], whole)
    rep[sh["event"][sel].astype(np.int64)] = True
    ops = t.events["op"]
    seeds = {int(i) for i in np.unique(ops) if t.string(int(i)) in JAX_ACROSS}
    inp = t.inputs
    order = np.argsort(inp["event"], kind="stable")
    ev, prod = inp["event"][order], inp["producer"][order]
    bounds = np.searchsorted(ev, np.arange(n + 1))
    kind = t.events["kind"]
    for e in np.flatnonzero(kind == schema.KIND_EQN).tolist():
        if not t.event_device(e):
            continue
        if int(ops[e]) in seeds:
            rep[e] = True
            continue
        ps = prod[bounds[e]:bounds[e + 1]]
        known = ps[(ps >= 0) & (ps < e)]
        consts = (ps == schema.PRODUCER_LITERAL) | (ps == schema.PRODUCER_CONST)
        if len(known) and len(known) + int(consts.sum()) == len(ps) and rep[known].all():
            rep[e] = True
    return rep


def check_rank(ref_path: str, path: str, rank: int) -> tuple:
    """(rank, [(reference event, this rank's event)] of the replicated events whose
    copies differ (the first MAX_DEPARTURES, in order), replicated events compared): one
    rank against the reference, run where `pool.run` puts it."""
    from ..differ import Differ

    with Trace(ref_path) as ref, Trace(path) as t:
        check_rank_of(t, rank)
        check_same_run(ref, t)
        d = Differ(ref, t)
        mask = replicated_mask(ref) | jax_replicated_mask(ref)
        ia, ib = d.pairs()
        keep = mask[ia] & (d.sa.n_out[ia] > 0)
        ia, ib = ia[keep], ib[keep]
        bad = d.sa.content[ia] != d.sb.content[ib]
        pairs = [(int(a), int(b)) for a, b in zip(ia[bad][:MAX_DEPARTURES],
                                                    ib[bad][:MAX_DEPARTURES])]
        return rank, pairs, int(len(ia)), t.world_size


def check_same_run(ref: Trace, t: Trace):
    """Two ranks of one run name the same world size in their manifests."""
    if ref.world_size != t.world_size:
        raise TraceError(f"{t.path}: a run of world size {t.world_size} beside rank "
                         f"{ref.rank}'s trace of world size {ref.world_size} ({ref.path}): "
                         f"these traces are not the ranks of one run; put each run's per-rank "
                         f"traces in their own directory")


def _check_rank_set(spec, ranks, world_size):
    """Every rank of the run is there: ranks 0 .. world size - 1 (when the manifests
    name the world size)."""
    if world_size is None:
        return
    missing = sorted(set(range(world_size)) - set(ranks))
    extra = sorted(r for r in ranks if not 0 <= r < world_size)
    if missing or extra:
        what = (f"rank{'s' if len(missing) > 1 else ''} {_listed(missing)} "
                f"{'are' if len(missing) > 1 else 'is'} missing" if missing else
                f"rank{'s' if len(extra) > 1 else ''} {_listed(extra)} lie{'' if len(extra) > 1 else 's'} "
                f"outside it")
        raise TraceError(f"{os.fspath(spec)}: the traces are of a {world_size}-rank run but "
                         f"{what} (it holds ranks {_listed(sorted(ranks))}); replicas compares "
                         f"every rank of one run")


def _listed(xs, limit=8):
    return ", ".join(map(str, xs[:limit])) + (f" ... ({len(xs)} in all)" if len(xs) > limit else "")


def _departure(t: Trace, e: int, rank=None, device="") -> ReplicaDeparture:
    ev = t.event(e)
    return ReplicaDeparture(rank=rank, device=device, step=ev["step"], op=ev["op"],
                            source=ev["source"], event=e, name_stack=ev["name_stack"],
                            phase=ev["phase"])


def check_ranks(spec, workers: Optional[int] = None, scheduler=None) -> ReplicasResult:
    """The cross-rank check of one run's per-rank traces (module docstring)."""
    ranks = rank_traces(spec)
    if len(ranks) < 2:
        raise TraceError(f"{os.fspath(spec)}: one rank only; replicas compares the ranks of "
                         f"one run (give the directory of its per-rank traces) or the "
                         f"devices of one trace")
    order = sorted(ranks)
    ref_rank, others = order[0], order[1:]
    ref_path = os.path.abspath(ranks[ref_rank])
    jobs = [(ref_path, os.path.abspath(ranks[r]), r) for r in others]
    done = pool.run(check_rank, jobs, workers=workers, scheduler=scheduler)
    # every task checked its world size against the reference's: they are all equal
    _check_rank_set(spec, ranks, done[0][3])
    done = [x[:3] for x in done]
    checked = max((c for _, _, c in done), default=0)
    starts = [pairs[0][0] for _, pairs, _ in done if pairs]
    if not starts:
        return ReplicasResult(verdict="consistent", checked=checked, ranks=order,
                              reference_rank=ref_rank)
    first_ref = min(starts)
    differing = {r: dict(pairs)[first_ref] for r, pairs, _ in done
                 if first_ref in dict(pairs)}
    note = ""
    if len(others) >= 2 and set(differing) == set(others) and \
            _agree([ranks[r] for r in others], [differing[r] for r in others]):
        # every other rank agrees against the reference: the reference departed
        with Trace(ranks[ref_rank]) as t:
            first = _departure(t, first_ref, rank=ref_rank)
        departed = [ref_rank]
    else:
        r0 = min(differing)
        with Trace(ranks[r0]) as t:
            first = _departure(t, differing[r0], rank=r0)
        departed = sorted(differing)
        if len(order) == 2:
            note = (f"two ranks: which one departed cannot be told; rank {r0} is named "
                    f"against rank {ref_rank}")
    return ReplicasResult(verdict="diverged", checked=checked, ranks=order,
                          reference_rank=ref_rank, first=first, departed=departed, note=note)


def _agree(paths, events) -> bool:
    """Do these ranks' copies of one event agree with each other (output hashes)?"""
    digests = set()
    for p, e in zip(paths, events):
        with Trace(p) as t:
            rows = t.value_rows(e, schema.ROLE_OUT)
            digests.add(tuple(int(h) for h in rows["hash"]))
    return len(digests) == 1


def check_devices(path) -> ReplicasResult:
    """The within-trace check: replicas of one value, and per-device results that must
    agree (a replicated collective's, and what is computed only from them) (module
    docstring; `Trace.device_values`). A trace without per-device values is consistent,
    with a note."""
    with Trace(path) as t:
        has = getattr(t, "has_devices", None)
        if has is None or not has():
            return ReplicasResult(verdict="consistent", checked=0, ranks=[],
                                  note="no per-device values in this trace (replicas compares "
                                       "the ranks of one run, or the devices of a sharded "
                                       "JAX trace)")
        n = len(t.events)
        checked, departures = 0, []          # [(event, device)]
        # 1. the copies of one value that a sharding replicates (same shard index)
        for e in range(n):
            n_out = len(t.value_rows(e, schema.ROLE_OUT))
            for slot in range(max(1, n_out)):
                dvs = t.device_values(e, slot)
                if len(dvs) < 2:
                    break
                by_shard = {}
                for dv in dvs:
                    if dv.digest:
                        by_shard.setdefault(dv.shard, []).append(dv)
                bad = None
                for copies in by_shard.values():
                    if len(copies) > 1:
                        checked += 1
                        i = _minority([c.digest for c in copies])
                        if i is not None and bad is None:
                            bad = copies[i].device
                if bad is not None:
                    departures.append((e, bad))
                    break
        # 2. per-device events (a shard_map / pmap body replayed per device) that must
        # agree: a replicated collective, or an op of only such values and constants
        groups, rep, seen = {}, set(), Counter()
        inp = t.inputs
        order = np.argsort(inp["event"], kind="stable")
        ev_sorted, prod = inp["event"][order], inp["producer"][order]
        bounds = np.searchsorted(ev_sorted, np.arange(n + 1))
        device_of = getattr(t, "event_device", lambda e: "")
        group_of, reads_rep = {}, {}   # every per-device event: its group; reads a rep value?
        for e in range(n):
            dev = device_of(e)
            if not dev:
                continue
            ev = t.event(e)
            key0 = (ev["call"], ev["step"], ev["op"], ev["source"], ev["iter"])
            seen[(key0, dev)] += 1
            key = key0 + (seen[(key0, dev)],)
            group_of[e] = key
            members = groups.setdefault(key, [])
            members.append(e)
            ps = prod[bounds[e]:bounds[e + 1]]
            known = [int(p) for p in ps if p >= 0]
            reads_rep[e] = any(p in rep for p in known)
            consts = sum(1 for p in ps if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST))
            if ev["op"] in JAX_REPLICATED or \
                    (known and len(known) + consts == len(ps) and all(p in rep for p in known)):
                rep.add(e)
        for members in groups.values():
            if len(members) < 2 or members[0] not in rep:
                continue
            copies = [(device_of(e), _digest(t, e), e) for e in members]
            if any(not c[1] for c in copies):
                continue
            checked += 1
            i = _minority([c[1] for c in copies])
            if i is not None:
                departures.append((copies[i][2], copies[i][0]))
        if not departures:
            return ReplicasResult(verdict="consistent", checked=checked, ranks=[])
        e, dev = _innermost(t, sorted(departures))
        body = _body_origin(t, e, dev, groups, group_of, reads_rep, rep, device_of)
        return _device_departure(t, body if body is not None else e, dev, checked)


def _digest(t, e) -> str:
    """The content digest of a per-device event's one copy ("" when there is none)."""
    dvs = t.device_values(e)
    return dvs[0].digest if len(dvs) == 1 else ""


def _body_origin(t, outer, device, groups, group_of, reads_rep, rep, device_of):
    """Inside a departed call or `shard_map` equation: the earliest per-device op of
    `device` that reads a replicated value (a collective's result, or what is computed
    only from such results) and whose result is not the one most devices got. That is
    where the device's copy left the replicated values (a per-device update applied
    after the all-reduce), though the op also reads a per-device value (`axis_index`)
    and so is not itself checked as replicated. None: no such op (the body was not
    recorded per device, or the departure is not in it)."""
    for e in sorted(group_of):
        if e <= outer or device_of(e) != device or not reads_rep.get(e) or e in rep:
            continue
        if not _inside(t, e, outer):
            continue
        members = groups[group_of[e]]
        if len(members) < 3:
            continue
        digests = [_digest(t, m) for m in members]
        mine = digests[members.index(e)]
        common, count = Counter(digests).most_common(1)[0]
        if mine and common and mine != common and count * 2 > len(members):
            return e
    return None


def _inside(t, e, outer):
    """Whether event `e` is inside event `outer` (an equation of that call, or of a body
    within it), following parent and call links at most 64 levels up."""
    parent, call = t.events["parent"], t.events["call"]
    hops = 0
    while e >= 0 and hops < 64:
        p, c = int(parent[e]), int(call[e])
        if outer in (p, c):
            return True
        e, hops = p, hops + 1
    return False


def _innermost(t, departures):
    """The earliest departure, then the earliest one inside it (an equation of the call,
    the body of the shard_map) while there is one: the op, not the call around it."""
    cur = departures[0]
    while True:
        inner = [d for d in departures if d[0] != cur[0] and _inside(t, d[0], cur[0])]
        if not inner:
            return cur
        cur = inner[0]


def _minority(digests) -> Optional[int]:
    """Index of the first copy that differs from the most common digest (None: all
    equal; with two copies, the second)."""
    counts = Counter(digests)
    if len(counts) == 1:
        return None
    common = counts.most_common(1)[0][0]
    return next(i for i, d in enumerate(digests) if d != common)


def _device_departure(t, e, device, checked):
    return ReplicasResult(verdict="diverged", checked=checked, ranks=[],
                          first=_departure(t, e, rank=t.rank, device=device),
                          devices=[device])


def replicas(spec, workers: Optional[int] = None, scheduler=None) -> ReplicasResult:
    """Python API: check one run's replicas: a directory or glob of per-rank traces
    (across ranks, then each rank's devices) or one trace (its devices)."""
    return _nothing_is_not_consistent(_replicas(spec, workers, scheduler))


def _replicas(spec, workers, scheduler) -> ReplicasResult:
    s = os.fspath(spec)
    if is_rank_set(s):
        ranks = rank_traces(s)
        if len(ranks) == 1:
            return _nothing_is_not_consistent(check_devices(next(iter(ranks.values()))))
        result = check_ranks(s, workers=workers, scheduler=scheduler)
        if result.verdict == "diverged":
            return result
        paths = [(os.path.abspath(p),) for _, p in sorted(ranks.items())]
        for dev in pool.run(check_devices, paths, workers=workers, scheduler=scheduler):
            if dev.verdict == "diverged":
                return dev
            result.checked += dev.checked
        if not result.checked:
            result = dataclasses.replace(result, note=(
                f"no replicated value in these {len(ranks)} ranks' traces: no replicated "
                f"collective (all-reduce, broadcast, all-gather) in rank "
                f"{result.reference_rank}'s trace and no per-device values"))
        return _nothing_is_not_consistent(result)
    if not os.path.exists(s):
        raise TraceError(f"{s}: no such trace file or directory")
    return _nothing_is_not_consistent(check_devices(s))


def _nothing_is_not_consistent(result: ReplicasResult) -> ReplicasResult:
    """A check that compared no value says so ("nothing_to_compare", exit code 2: a gate that
    checked nothing must not pass), never "consistent"."""
    if result.verdict == "consistent" and not result.checked:
        return dataclasses.replace(result, verdict=NOTHING,
                                   note=result.note or "no replicated value to compare")
    return result
