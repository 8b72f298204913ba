"""How much of the two runs a comparison compared: the evidence behind a verdict.

A MATCH says "every value compared agrees"; it is worth something only when what was
compared covers the program. `measure` counts, for each side, the computing events
recorded (computing units for two frameworks and for eager against torch.compile),
how many were paired with the other side and how many compared (both held bytes or a
hash), per phase, with the values and bytes behind them and what stopped or lost the
capture. `assess` decides whether that is enough for a MATCH, why not, the largest
unpaired regions and the next step. `locate` turns a MATCH on too little evidence into
INCONCLUSIVE (exit code 3); a DIVERGED verdict stands on what was compared, its
coverage shown beside it.

The bar (docs/json.md, "Coverage"): at least `BAR` of each side's computing events paired
and compared, no capture stopped or lost, no truncated trace.

Two frameworks: a side's counted units are those that are the other side's work too:
paired units, and units from the side's first pair on that compute from a value both
sides were handed (data, weights). RNG, initialisers, a Flax `init`'s forward on its
fresh weights and optax's own ops (compared by role at the optimizer snapshots, like
torch's ops inside `optimizer.step`) are counted apart (`setup`). A unit inside a paired module (a LayerNorm's
`reduce_sum` under the LayerNorm paired at its output, an activation read by the next
layer) counts as paired: its result flows into a compared one of the same module. So does a
unit whose result is a parameter's gradient the optimizer takes, where the optimizer
snapshots were compared by role (Flax's BatchNorm transpose sums its scale's and bias's
gradients in `reduce_sum`s that torch's `native_batch_norm_backward` returns whole). A unit
whose result reaches only compared units of unrelated modules does not.
"""

from __future__ import annotations

import os

import numpy as np

from ..trace import schema
from ..trace.values import rows_with_data
from .compare.levels import not_compared, same_hash_function
from .pairing.graph import module_path
from .result import Coverage, CoverageSide, UnpairedRegion

BAR = 0.8            # the share of each side's computing events that must be paired and compared
MAX_REGIONS = 3      # unpaired regions named
MAX_HOPS = 16        # byte-moving ops followed from a unit to its readers / a value to its origin
MAX_WALK = 4096      # events visited from one unit


# -- what each trace holds ---------------------------------------------------------------------

def _events_of(t, rows):
    """Bool per event of t: some row of `rows` (values or shards) belongs to it."""
    n = len(t)
    ev = rows["event"].astype(np.int64)
    has = np.zeros(n, bool)
    has[ev[(ev >= 0) & (ev < n)]] = True
    return has


def _has_value(t):
    """Bool per event: an output whose bytes or hash were recorded (or per-device shard
    digests of a value with no global bytes)."""
    out = t.values[t.values["role"] == schema.ROLE_OUT]
    has = _events_of(t, out[rows_with_data(out)[1]])
    sh = getattr(t, "shard_rows", None)
    if sh is not None and len(sh):
        has |= _events_of(t, sh)
    return has


def _has_bytes(t):
    """Bool per event: an output whose bytes were stored (what still compares across two
    hash functions: compare/levels.py `hashes_agree`)."""
    out = t.values[t.values["role"] == schema.ROLE_OUT]
    return _events_of(t, out[rows_with_data(out)[0]])


def _has_output(t):
    """Bool per event: an output value that could ever be compared (not uninitialised
    memory, `torch.empty`): events without one are no evidence either way."""
    v = t.values
    return _events_of(t, v[(v["role"] == schema.ROLE_OUT) &
                           ((v["flags"] & schema.VFLAG_UNINIT) == 0)])


def _value_counts(t, events):
    """(output values of `events`, those with bytes or a hash, bytes stored)."""
    v = t.values
    out = v[(v["role"] == schema.ROLE_OUT) & np.isin(v["event"], events)]
    stored, ok = rows_with_data(out)
    return int(len(out)), int(ok.sum()), int(np.clip(out["nbytes"][stored], 0, None).sum())


def capture_problems(t) -> list:
    """What stopped or lost this trace's capture, one line each (manifest text is cut
    short; the renderers escape it)."""
    out = []
    name = os.path.basename(t.path)
    if not t.complete:
        out.append(f"{name}: the recording did not finish (truncated): what came after its "
                   f"last commit was never recorded")
    if not len(t):
        out.append(f"{name}: no events were recorded")
    m = t.manifest
    if m.get("recording_error"):
        out.append(f"{name}: recording stopped: {str(m['recording_error'])[:200]}")
    fws = m.get("frameworks")
    fws = fws if isinstance(fws, dict) else {}
    for fw in ("jax", "torch"):
        sec = fws.get(fw)
        if not isinstance(sec, dict):
            continue
        if sec.get("recording_error"):
            at = sec.get("recording_stopped_at_event")
            out.append(f"{name}: {fw} capture stopped" +
                       (f" at event {at}" if isinstance(at, int) else "") +
                       f": {str(sec['recording_error'])[:200]}")
        sub = sec.get("subclasses")
        lost = sub.get("unreadable_values") if isinstance(sub, dict) else None
        if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0:
            out.append(f"{name}: {fw} capture could not read {lost:,} values (tensor "
                       f"subclasses whose bytes it cannot reach)")
    errs = fws.get("capture_errors")
    if isinstance(errs, list) and errs:
        out.append(f"{name}: a capture could not start: {str(errs[0])[:200]}")
    out += [f"{name}: its script loaded {fw}, which the recording did not capture"
            for fw in missed_frameworks(t)]
    return out


def missed_frameworks(t):
    """Frameworks the recorded script loaded that the trace did not capture (the
    manifest's `frameworks.missed`, written by the runner; issue #26)."""
    fws = t.manifest.get("frameworks")
    missed = fws.get("missed") if isinstance(fws, dict) else None
    if not isinstance(missed, list):
        return []
    return [x for x in ("jax", "torch") if x in missed]   # known names only: untrusted


# -- two frameworks: which units are the other side's work, which were compared ---------------

def _external_atoms(p, g, s, same_framework):
    """The support items (`pairing/atoms.py`) of the atoms that are the other side's too:
    those side `s` (graph `g`) was handed from outside its recorded computation (data and
    weights given to both sides), and those both sides computed themselves (two runs of
    one program drawing the same weights and data from their RNG: the forward on them is
    both runs' work, whatever a user map pairs: `same_framework`). A value only this side
    computed (Flax's fresh weights, which the torch port is handed) is not, nor one each
    framework of a port computes on its own (`jnp.arange` and `torch.arange`: setup)."""
    memo = {}
    return {("a", aid) for aid, rows in p.atom_rows.items()
            if rows[s] is not None and (_handed_in(g, rows[s], memo) or (
                same_framework and rows[1 - s] is not None and g.key(rows[s]) in p.computed))}


def _handed_in(g, row, memo, depth=0):
    """The value of `row` reached this side from outside: an input snapshot or a call
    argument of unknown producer, through byte-moving ops only."""
    t = g.t
    e = int(row["event"])
    key = (e, int(row["slot"]), int(row["role"]))
    if key in memo:
        return memo[key]
    memo[key] = False
    if not 0 <= e < g.n or depth > MAX_HOPS:
        return False
    kind = int(g.kind[e])
    if kind == schema.KIND_INPUT:
        memo[key] = True
        return True
    if int(row["role"]) == schema.ROLE_OUT and (
            int(g.unit_of[e]) >= 0 or kind == schema.KIND_CALL or
            g.fam_of.get(int(t.events["op"][e])) is not None):
        return False                       # this side computed it
    found = False
    for r in t.input_rows(e):
        if int(row["role"]) == schema.ROLE_IN and int(r["slot"]) != int(row["slot"]):
            continue                       # a call's argument: that argument's producer only
        prod = int(r["producer"])
        if prod == schema.PRODUCER_UNKNOWN:
            found = True
        elif 0 <= prod < g.n:
            rows = [v for v in t.value_rows(prod, schema.ROLE_OUT)
                    if int(v["slot"]) == int(r["producer_slot"])]
            found = bool(rows) and _handed_in(g, rows[0], memo, depth + 1)
        if found:
            break
    memo[key] = found
    return found


class _Readers:
    """Which units read a unit's result, through byte-moving ops (t.inputs, by producer)."""

    def __init__(self, g):
        self.g = g
        inp = g.t.inputs
        n = g.n
        prod, cons = inp["producer"].astype(np.int64), inp["event"].astype(np.int64)
        ok = (prod >= 0) & (prod < n) & (cons >= 0) & (cons < n) & (cons != prod)
        order = np.argsort(prod[ok], kind="stable")
        self.P, self.C = prod[ok][order], cons[ok][order]

    def events(self, e, depth=0):
        lo, hi = np.searchsorted(self.P, [e, e + 1])
        out = self.C[lo:hi].tolist()
        par = int(self.g.parent[e])
        if not out and self.g.kind[e] == schema.KIND_EQN and 0 <= par < self.g.n and depth < 8:
            return self.events(par, depth + 1)   # its outputs are the enclosing call's
        return out

    def units(self, k):
        """The units that read unit k's result (through byte-moving ops), and whether that
        result is a gradient the optimizer takes (it reaches optax's tagged grads, which its
        snapshot holds and the comparison by role compares)."""
        g = self.g
        rep = g.units[k].rep
        seen, frontier, out, grads = {rep}, [rep], set(), False
        for _ in range(MAX_HOPS):
            nxt = []
            for e in frontier:
                for c in self.events(e):
                    if c in seen:
                        continue
                    seen.add(c)
                    u = int(g.unit_of[c])
                    if u >= 0 and u != k:
                        out.add(u)
                    elif u < 0 and g.mask[c]:
                        grads |= bool(g.optimizer[c])
                        nxt.append(c)
            if not nxt or len(seen) > MAX_WALK:
                break
            frontier = nxt
        return out, grads


def _port_units(g, m, external, optimizer_compared=False):
    """(counted, covered) per unit of one side of a two-framework comparison (the
    module docstring says which units count and which are covered); `optimizer_compared`:
    the optimizer snapshots were paired by role, so a parameter's gradient is compared."""
    units = g.units
    paired = [bool(m[u.rep] >= 0) for u in units]
    covered = list(paired)
    counted = [False] * len(units)
    first = min((u.rep for u, p in zip(units, paired) if p), default=None)
    readers = _Readers(g)
    src = g.t.events["source"]
    for k in sorted(range(len(units)), key=lambda k: -units[k].rep):
        if not paired[k] and ((first is not None and units[k].rep < first) or not (
                g.support[k] and external & g.support[k]) or
                _optimizer_internal(g, src[units[k].rep])):
            continue
        counted[k] = True
        if covered[k]:
            continue
        mod = units[k].module
        read_by, grads = readers.units(k)
        covered[k] = (grads and optimizer_compared) or any(
            covered[v] and (not mod or units[v].module == mod or
                            units[v].module.startswith(mod + "/")) for v in read_by)
    return counted, covered


def _optimizer_internal(g, source):
    """A JAX unit that optax ran (its moments, its norms): the optimizer is compared by
    role at its snapshots, as torch's ops inside `optimizer.step` are, not unit by unit."""
    return g.fw == schema.FW_JAX and OPTAX_FRAME in g.t.string(source)


OPTAX_FRAME = "/optax/"


# -- one side ----------------------------------------------------------------------------------

def _phase(p, k):
    return "optimizer" if k == schema.KIND_OPTIM else schema.PHASE_NAMES.get(int(p), "forward")


def _counted(d, side):
    """(event ids counted, bool paired per counted event, phase per counted event, what is
    counted, events left uncounted as setup, unpaired runs [(start event, length)])."""
    al = d.al
    t = d.ta if side == "a" else d.tb
    m = al.a2b if side == "a" else al.b2a
    ph, kind = t.events["phase"], t.events["kind"]
    if hasattr(al, "units_a"):                              # two frameworks
        g = d.ga if side == "a" else d.gb
        counted, covered = _port_units(g, m, _external_atoms(d.p, g, 0 if side == "a" else 1,
                                                             d.ga.fw == d.gb.fw),
                                       optimizer_compared=bool(getattr(d, "optim", None)))
        units = [u for u, c in zip(g.units, counted) if c]
        paired = [p for p, c in zip(covered, counted) if c]
        phase = ["backward" if u.phase == schema.PHASE_BWD else "forward" for u in units]
        runs = _runs([u.rep for u in units], paired)
        # optimizer snapshots: paired by role, one per step
        fw = d.fw_a if side == "a" else d.fw_b
        snaps = np.flatnonzero((kind == schema.KIND_OPTIM) & (t.events["framework"] == fw))
        mine = {ea if side == "a" else eb for ea, eb in getattr(d, "optim", [])}
        reps = [u.rep for u in units] + snaps.tolist()
        paired += [e in mine for e in snaps.tolist()]
        phase += ["optimizer"] * len(snaps)
        return (np.asarray(reps, np.int64), np.asarray(paired, bool), phase,
                "computing units", len(g.units) - len(units), runs)
    if getattr(al, "units", None) is not None:              # eager vs torch.compile
        ua, ub, ual = al.units
        u = ua if side == "a" else ub
        reps = np.asarray(u.reps, np.int64)
        paired = (ual.a2b if side == "a" else ual.b2a) >= 0
        keep = _has_output(t)[reps] if len(reps) else np.zeros(0, bool)
        reps, paired = reps[keep], paired[keep]
        return (reps, paired, [_phase(ph[e], kind[e]) for e in reps.tolist()],
                "computing units", 0, _runs(reps.tolist(), paired.tolist()))
    reps = np.flatnonzero(_has_output(t))      # events with something to compare
    paired = m[reps] >= 0
    return (reps, paired, [_phase(ph[e], kind[e]) for e in reps.tolist()], "events",
            0, _runs(reps.tolist(), paired.tolist()))


def _runs(reps, paired):
    """Runs of consecutive unpaired entries: [(first event, length)]."""
    out, start, length = [], None, 0
    for e, p in zip(reps, paired):
        if p:
            if start is not None:
                out.append((start, length))
            start, length = None, 0
        else:
            start = e if start is None else start
            length += 1
    if start is not None:
        out.append((start, length))
    return out


def _side(d, side, has_a, has_b, problems, stored=None):
    """`stored`: (a's, b's) events with bytes, where the traces hash with two functions
    (a pair compares only where one side holds bytes), else None."""
    t = d.ta if side == "a" else d.tb
    reps, paired, phase, counted, setup, runs = _counted(d, side)
    own, other = (has_a, has_b) if side == "a" else (has_b, has_a)
    own_b, other_b = (None, None) if stored is None else \
        (stored if side == "a" else stored[::-1])
    partner = (d.al.a2b if side == "a" else d.al.b2a)[reps] if len(reps) else reps
    compared = paired & own[reps] if len(reps) else np.zeros(0, bool)
    direct = compared & (partner >= 0)
    compared[direct] = other[partner[direct]]
    if stored is not None:
        compared[direct] &= own_b[reps[direct]] | other_b[partner[direct]]
    missing = not_compared(d)[0 if side == "a" else 1]
    if missing and len(reps):   # a hash pair that differs, with no statistics to compare
        compared &= ~np.isin(reps, np.fromiter(missing, np.int64))
    if hasattr(d.al, "units_a"):   # optimizer snapshots are paired by role, not in a2b
        optim = dict(getattr(d, "optim", []))
        optim = optim if side == "a" else {v: k for k, v in optim.items()}
        for i, e in enumerate(reps.tolist()):
            if phase[i] == "optimizer" and e in optim:
                compared[i] = bool(own[e]) and bool(other[optim[e]]) and (
                    stored is None or bool(own_b[e]) or bool(other_b[optim[e]]))
    by_phase = {}
    for name in ("forward", "backward", "optimizer"):
        sel = np.asarray([p == name for p in phase], bool)
        if sel.any():
            by_phase[name] = {"events": int(sel.sum()), "paired": int(paired[sel].sum()),
                              "compared": int(compared[sel].sum())}
    values, with_data, nbytes = _value_counts(t, reps)
    fw = getattr(d, "fw_" + side, None)
    fws = [schema.FW_NAMES.get(fw, "")] if fw is not None else sorted(
        {schema.FW_NAMES.get(int(f), "") for f in np.unique(t.events["framework"])} - {""})
    cov = CoverageSide(side=side, path=t.path, framework="+".join(fws), counted=counted,
                       events=int(len(reps)), paired=int(paired.sum()),
                       compared=int(compared.sum()), setup=int(setup), values=values,
                       values_with_data=with_data, bytes=nbytes, by_phase=by_phase,
                       rank=getattr(t, "rank", None), capture=problems)
    return cov, [(side, s, n) for s, n in runs]


def _regions(d, runs):
    """The unpaired runs named, by op, module and line: two frameworks, the first of each
    side (the nearest the paired frontier: where the pairing stopped, what a `--map`
    should name), then the largest; else the largest, biggest first."""
    first = []
    if hasattr(d.al, "units_a"):
        for side in ("a", "b"):
            mine = [r for r in runs if r[0] == side]
            if mine:
                first.append(min(mine, key=lambda r: r[1]))
    rest = [r for r in sorted(runs, key=lambda r: -r[2]) if r not in first]
    out = []
    for side, e, length in (first + rest)[:max(MAX_REGIONS, len(first))]:
        t = d.ta if side == "a" else d.tb
        ev = t.events[e]
        out.append(UnpairedRegion(side=side, start=int(e), length=int(length),
                                  op=t.string(ev["op"]),
                                  module=module_path(t.string(ev["name_stack"]),
                                                     int(ev["framework"])),
                                  source=t.string(ev["source"])))
    return out


def measure(d) -> Coverage:
    """The coverage of the comparison held by differ `d`."""
    ta, tb = d.ta, d.tb
    has_a = _has_value(ta)
    has_b = has_a if tb is ta else _has_value(tb)
    pa = capture_problems(ta)
    pb = [] if tb is ta else capture_problems(tb)
    stored = None if same_hash_function(ta, tb) else (_has_bytes(ta), _has_bytes(tb))
    a, runs_a = _side(d, "a", has_a, has_b, pa, stored)
    b, runs_b = _side(d, "b", has_a, has_b, pb, stored)
    return assess(a, b, _regions(d, runs_a + runs_b), cross=hasattr(d.al, "units_a"))


# -- the verdict's bar -------------------------------------------------------------------------

def _frac(x, n):
    return (x / n) if n else 0.0


def assess(a: CoverageSide, b: CoverageSide, regions, cross=False) -> Coverage:
    """Is the coverage enough for a MATCH? The reasons when not, and the next step."""
    reasons, steps = [], []
    problems = list(dict.fromkeys(a.capture + b.capture))
    reasons += problems
    if problems:
        steps.append("record again so that the capture runs to the end (see above)")
    unpaired = unvalued = False
    for s in (a, b):
        label = f"side {s.side}" + (f" ({s.framework})" if s.framework else "")
        if s.events and _frac(s.paired, s.events) < BAR:
            unpaired = True
            reasons.append(f"{label}: only {s.paired:,} of {s.events:,} {s.counted} paired "
                           f"({_frac(s.paired, s.events):.0%}; the bar is {BAR:.0%})")
        elif s.paired and _frac(s.compared, s.events) < BAR:
            unvalued = True
            reasons.append(f"{label}: only {s.compared:,} of {s.events:,} {s.counted} compared "
                           f"(the others hold no bytes or hash on one side)")
    if not (a.compared or b.compared):
        unvalued = True
        reasons.append("nothing was compared: no paired event holds values on both sides")
    for s in (a, b):
        opt = s.by_phase.get("optimizer", {})
        if s.compared and s.compared == opt.get("compared") and (s.setup or s.events > opt["events"]):
            # the snapshots say where training ended, not what computed it
            reasons.append(f"side {s.side}: no computing unit was compared, only the "
                           f"{opt['compared']:,} optimizer snapshots")
    if unvalued:
        steps.append("record both runs with values (--level full, or --level stats: a hash "
                     "and statistics of every value)")
    if unpaired and cross:
        ra = next((r for r in regions if r.side == "a" and r.module), None)
        rb = next((r for r in regions if r.side == "b" and r.module), None)
        hint = (f" --map '{{\"{ra.module}\": \"{rb.module}\"}}'" if ra and rb else " --map")
        steps.append(f"tell the pairing which modules correspond:{hint} (--show-mapping "
                     f"shows what paired)")
    elif unpaired:
        steps.append("the runs executed different ops: look at the largest unpaired regions "
                     "(tracediff show TRACE EVENT)")
    return Coverage(a=a, b=b, bar=BAR, sufficient=not reasons, reasons=reasons,
                    unpaired=regions, next_step="; ".join(dict.fromkeys(steps)))
