"""The chain from an origin to the first difference beyond tolerance and to the outputs.

Dataflow graph of trace a: an edge producer -> consumer for every row of the `inputs`
table, plus an edge from a replayed equation that no other event reads (an output of its
jaxpr) to its parent (the enclosing call or nested jit equation), since the values that
leave a jit call are the call's own outputs. Only events that are paired with b and
whose outputs differ bitwise take part: the difference can only travel through them.

From the origin, a breadth-first search gives the shortest dataflow path to the target
(the first event beyond tolerance) and then on to the last differing event reachable
(the latest along the run: the final outputs as far as the trace shows them). Each hop
reports its outputs' worst relative difference, its inputs' worst relative difference
and their ratio, the amplification (output rel / input rel): >1 the op magnified the
difference, <1 it damped it. A view or reinterpretation (`align.structure.is_view`: a
transpose, `to_local()`, a reshape) computes nothing: it has no amplification (issue 51).
"""

import collections
from typing import Optional

import numpy as np

from ...trace import schema
from ..align.structure import is_view
from ..differ import BITWISE
from ..result import Chain, EventRef, Gap, Hop, Metrics, Strongest

MAX_LINKS = 200        # hops kept
SHOWN = 10             # hops shown by the renderers after collapsing
MAX_VISIT = 500_000


def hashes_comparable(d):
    """True when both traces hash values the same way (then equal content hashes mean
    equal values; traces of different tracediff versions may use different hashes)."""
    def name(t):
        rec = (t.manifest or {}).get("recording") or {}
        return rec.get("hash") if isinstance(rec, dict) else None
    return name(d.ta) == name(d.tb)


class _Differs:
    """Bool per a-event, lazily: paired and outputs differ bitwise."""

    def __init__(self, d):
        self.d = d
        ia, ib = d.pairs()
        self.paired = np.zeros(len(d.ta), bool)
        self.paired[ia] = True
        self.fast = hashes_comparable(d)
        self.m = np.zeros(len(d.ta), bool)
        self.m[ia] = d.sa.content[ia] != d.sb.content[ib]
        self.memo = {}

    def __getitem__(self, ea):
        if not self.m[ea]:
            return False
        if self.fast:
            return True
        hit = self.memo.get(ea)
        if hit is None:
            hit = self.memo[ea] = not self.d.equal_at(ea, int(self.d.al.a2b[ea]), BITWISE)
        return hit

    def __setitem__(self, ea, value):
        self.m[ea] = value
        self.memo[ea] = value


def differing_mask(d):
    """Per a-event (indexable): paired and outputs differ bitwise."""
    return _Differs(d)


def consumers(d):
    """CSR (starts, targets) of the dataflow graph of trace a (see module docstring)."""
    t = d.ta
    n = len(t)
    inp = t.inputs
    src = inp["producer"].astype(np.int64)
    dst = inp["event"].astype(np.int64)
    ok = (src >= 0) & (src < n) & (dst >= 0) & (dst < n) & (src != dst)
    src, dst = src[ok], dst[ok]
    # equation outputs nobody reads flow into the parent's (the call's) outputs
    kind = d.sa.kind
    parent = d.sa.parent
    has_consumer = np.zeros(n, bool)
    has_consumer[src] = True
    sinks = np.flatnonzero((kind == schema.KIND_EQN) & ~has_consumer & (parent >= 0) &
                           (parent < n))
    src = np.concatenate([src, sinks])
    dst = np.concatenate([dst, parent[sinks]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    starts = np.searchsorted(src, np.arange(n + 1))
    return starts, dst


def _bfs(starts, targets, origin, allowed):
    prev = {origin: -1}
    q = collections.deque([origin])
    while q and len(prev) < MAX_VISIT:
        u = q.popleft()
        for v in targets[starts[u]:starts[u + 1]].tolist():
            if v not in prev and allowed[v]:
                prev[v] = u
                q.append(v)
    return prev


def _path(prev, end):
    out = []
    while end != -1:
        out.append(end)
        end = prev[end]
    return out[::-1]


def build(d, origin: int, target: Optional[int] = None, role: str = "origin") -> Chain:
    """The `Chain` from `origin` (an a-event) through `target` (the first beyond
    tolerance, if any) to the last differing event it reaches; `role`: what the first hop
    is called ("first_difference" where the origin is a write only one run has)."""
    allowed = differing_mask(d)
    allowed[origin] = True
    starts, targets = consumers(d)
    prev = _bfs(starts, targets, origin, allowed)
    chain = Chain()
    path = [origin]
    if target is not None and target != origin:
        if target in prev:
            path = _path(prev, target)
            chain.reaches_target = True
        else:
            chain.reaches_target = False
    start = path[-1]
    prev2 = prev if start == origin else _bfs(starts, targets, start, allowed)
    last = max(prev2)
    if last != start:
        path += _path(prev2, last)[1:]
    chain.last = int(last)
    chain.hops_total = len(path)
    hops = chain.hops
    prev_rel = None
    for i, ea in enumerate(path[:MAX_LINKS]):
        hops.append(_hop(d, ea, i, origin, target, last, prev_rel, role))
        prev_rel = hops[-1].metrics.max_rel
    if len(path) > MAX_LINKS:
        hops.append(_hop(d, path[-1], len(path) - 1, origin, target, last, None, role))
    amps = [(h.amplification, j) for j, h in enumerate(hops)
            if isinstance(h.amplification, float) and np.isfinite(h.amplification) and j > 0]
    if amps:
        a, j = max(amps)
        if a > 1:
            h = hops[j]
            chain.strongest = Strongest(index=h.a.index, op=h.a.op, amplification=a,
                                        input_rel=h.input_rel, output_rel=h.metrics.max_rel)
    return chain


def _hop(d, ea, i, origin, target, last, prev_rel, role="origin"):
    eb = int(d.al.a2b[ea])
    e = d.ta.event(ea)
    ev = EventRef(index=e["index"], op=e["op"], name_stack=e["name_stack"], source=e["source"],
                  step=e["step"], kind=e["kind"], framework=e["framework"], origin=e["origin"],
                  phase=e["phase"])
    r = d.compare_event(ea, eb) if eb >= 0 else {"metrics": None}
    m = r.get("metrics") or {}
    metrics = Metrics(max_rel=m.get("max_rel"), max_abs=m.get("max_abs"),
                      max_ulp=m.get("max_ulp"), within_tolerance=m.get("within_tolerance"))
    in_rel = None
    if eb >= 0:
        try:
            _, _, bad = d.inputs_match(ea, eb, BITWISE)
        except Exception:  # an odd input row: the hop is still shown
            bad = []
        rels = [(b.get("metrics") or {}).get("max_rel") for b in bad]
        rels = [x for x in rels if x is not None]
        in_rel = max(rels) if rels else (0.0 if i == 0 else None)
    if in_rel is None and prev_rel is not None and i > 0:
        in_rel = prev_rel   # the parent link (a call's outputs from its equations)
    out_rel = metrics.max_rel
    amp = None
    if in_rel and out_rel is not None and np.isfinite(in_rel) and in_rel > 0 and \
            not is_view(ev.op):   # a view moves the bytes it is given: nothing amplified
        amp = out_rel / in_rel
    roles = []
    if ea == origin:
        roles.append(role)
    if target is not None and ea == target:
        roles.append("first_beyond_tolerance")
    if ea == last:
        roles.append("last")
    return Hop(a=ev, b=eb, metrics=metrics, input_rel=in_rel, amplification=amp,
               role=",".join(roles))


def collapse(hops: list, shown: int = SHOWN) -> list:
    """At most `shown` entries for display: the origin, the target, the last, and the hops
    that amplified most; the rest are counted in `Gap`s. [Hop | Gap]."""
    if len(hops) <= shown:
        return list(hops)
    keep = {0, len(hops) - 1}
    keep |= {j for j, h in enumerate(hops) if h.role}
    ranked = sorted(range(1, len(hops) - 1),
                    key=lambda j: -(hops[j].amplification or 0.0)
                    if isinstance(hops[j].amplification, float) else 0.0)
    for j in ranked:
        if len(keep) >= shown - 1:
            break
        keep.add(j)
    out, skipped = [], 0
    for j, h in enumerate(hops):
        if j in keep:
            if skipped:
                out.append(Gap(skipped))
                skipped = 0
            out.append(h)
        else:
            skipped += 1
    return out
