"""Every source of a difference between two runs, ranked by its estimated share.

`locate` names the first difference, and the first is often the least: a CNN on a TPU against
a CPU differs first in its initialiser (1 ULP) while the convolutions' bf16 passes make 99 % of
the final difference. `find(d, result)` looks at every paired event whose outputs differ and
keeps those where a difference *enters*:

* **introduced**: its inputs are bitwise equal and its outputs differ (hashes decide, so this
  holds at every recording level);
* **adds beyond what it inherits**: its inputs already differ, and the op itself computes
  differently on the two sides. Each side's op is re-run here on that side's own recorded
  inputs (`explain/replay.py`), in its dtype and in float64. Where this machine reproduces
  both sides bitwise, both computed the same way: the op only carries what it inherited.
  Otherwise a side's *local error* is `recorded - exact(its own inputs)`, and what the op adds
  is `local_a - local_b`: the part of `out_a - out_b` left once the inherited part,
  `exact(in_a) - exact(in_b)`, is taken out. It is a source where one side computed
  differently: this machine reproduces one side and not the other, or (values computed on
  another backend, which nothing here reproduces) one side's local error is `LOCAL_RATIO`
  times the other's. Copies, views and single correctly rounded operations (`add`, `mul`,
  `div`, `sqrt` in JAX) cannot compute differently and are not replayed.

An inherited difference (the op adds nothing of its own) is never a source; two identical
runs have none. Events are first clustered by (op, module path, phase, kind of source), and a
few events of each cluster are replayed (`SAMPLE`, `MAX_REPLAYED` in all: the cost stays
bounded on long runs; a source says how many it replayed). Clusters are then grouped into
sources by mechanism and side: "bf16 pass on b: 12 convolutions and 6 matmuls".

**Share** (the estimator): a source's weight is the relative difference it adds where it acts,
`||added|| / ||output||` (L2), summed over its events (the events a cluster did not replay
are counted at the mean of those it did); the initialiser's is the relative difference of
the initial values as a whole. Share = weight / total weight. It is an estimate:
each source carries the counterfactual run that checks it (the program re-run with that
source removed), printed as the next step. On stats-level traces there are no values to
replay: only introduced sources are found, their weights come from the statistics, and the
result says it is a bound.
"""

from __future__ import annotations

import collections
import re

import numpy as np

from ... import shell
from ...trace import schema
from ..compare import args as _args
from ..compare import values as compare
from ..differ import BITWISE
from ..result import Source, Sources
from . import replay as _replay
from .causes import environment, op_class
from .chain import differing_mask
from .mechanisms import DESCRIPTIONS, fix_for, ran_as_bf16_pass
from .verdict import event_inputs, event_outputs, recorded_backend, \
    replay_backend, replay_verdict

LOCAL_RATIO = 4.0      # one side's local error this many times the other's: it computes differently
SAMPLE = 4             # events replayed per cluster
MAX_REPLAYED = 400     # events replayed in all
MAX_EXPLAINED = 8      # clusters whose mechanism is named by the full replay verdict
SHOWN = 5              # sources in locate's text

# RNG and initialiser ops: a difference there is "the initialiser differs"
_INIT = re.compile(
    r"^(aten::)?(jit:)?_?(truncated_normal|normal_real|normal|uniform|orthogonal|"
    r"random_\w+|threefry\w*|bernoulli_?|exponential_|random_|randn\w*|rand\w*|randint\w*|"
    r"randperm\w*|normal_|uniform_|trunc_normal_|kaiming\w*|xavier\w*|variance_scaling\w*|"
    r"lecun\w*|glorot\w*|he_\w+)$")
_COMPUTING = {schema.KIND_EQN, schema.KIND_EAGER, schema.KIND_OP}
# equations that hold other equations (those are the detail), or pass values through
_CONTAINERS = re.compile(r"^(jit:.*|pjit|closed_call|core_call|custom_jvp_call|custom_vjp_call\w*|"
                         r"remat2?|checkpoint|cond|while|scan|shard_map|xla_pmap|custom_\w+_call)$")
_IDENTITY = frozenset({"name", "stop_gradient", "optimization_barrier", "device_put",
                       "sharding_constraint", "copy_p"})
_DIGITS = re.compile(r"\d+")


def find(d, result) -> Sources:
    """The sources of the differences between the two traces of differ `d` (see the module
    docstring); `result` is locate's `LocateResult` (its environment differences)."""
    out = Sources()
    if result.first_difference is None:
        out.note = "the paired values are bitwise equal: no source"
        return out
    candidates = _candidates(d)
    out.examined = len(candidates)
    clusters = collections.OrderedDict()
    full = _has_bytes(d)
    for ea, eb, inputs_equal in candidates:
        key = _cluster_key(d, ea, inputs_equal)
        clusters.setdefault(key, []).append((ea, eb, inputs_equal))
    budget = MAX_REPLAYED
    measured = []
    for key, members in clusters.items():
        cl = _Cluster(key, members)
        budget -= cl.measure(d, full, budget)
        measured.append(cl)
    found = [cl for cl in measured if cl.is_source()]
    out.replayed = MAX_REPLAYED - budget
    out.not_judged = _not_judged(measured, found) + _compiled_calls(d)
    if not found:
        out.note = ("every difference is inherited: no paired op adds one of its own that "
                    "could be measured" if full else
                    "no op whose inputs are bitwise equal has outputs that differ")
        return out
    found.sort(key=lambda c: -c.weight)
    for i, cl in enumerate(found):
        cl.name_mechanism(d, explain=i < MAX_EXPLAINED)
    out.sources = _group(d, result, found)
    out.bound = not full
    if not full:
        out.note = ("stats-level traces hold hashes and statistics, not values: only ops "
                    "whose inputs are bitwise equal are found, and their shares are bounds "
                    "from the statistics")
    return out


def _not_judged(clusters, found):
    """[[op, events, reason]] of the clusters that computing ops whose local error could not
    be measured (not replayable here): the shares are of what was measured, and say so."""
    out = []
    for cl in clusters:
        if cl in found or cl.inputs_equal:
            continue
        reasons = [m.reason for _, _, m in cl.judged if m.reason.startswith(("not replayed:",
                                                                              "no exact"))]
        if reasons and len(reasons) == len(cl.judged):
            out.append([cl.op, len(cl.members), reasons[0]])
    merged = collections.OrderedDict()
    for op, n, why in out:
        k = (op, why)
        merged[k] = merged.get(k, 0) + n
    return [[op, n, why] for (op, why), n in merged.items()]


def _compiled_calls(d):
    """[[what, calls, why]] for the compiled jit calls whose outputs differ while their
    inputs differ too: their equations are judged one by one as replayed, but what the
    compiled program itself adds (fusion, an FMA contraction inside the jit) is not
    measured there, so the shares leave it out (a Flax CNN under SSE4.2 keeps 30 % of its
    difference with the initial parameters made equal, in its compiled steps)."""
    differs = differing_mask(d)
    ia, _ = d.pairs()
    calls = [ea for ea in ia.tolist() if d.sa.kind[ea] == schema.KIND_CALL and differs[ea]]
    if not calls:
        return []
    return [["compiled jit calls", len(calls), "judged through their replayed equations; what "
             "the compiled program adds where its inputs already differ (fusion, FMA "
             "contraction) is not measured"]]


def _has_bytes(d):
    """True when both traces hold values' bytes (full level): local errors can be measured."""
    def level(t):
        rec = (t.manifest or {}).get("recording") or {}
        return rec.get("level") if isinstance(rec, dict) else None
    return level(d.ta) not in ("stats", "calls") and level(d.tb) not in ("stats", "calls")


def _candidates(d):
    """[(ea, eb, inputs bitwise equal)] of the paired computing events whose outputs differ
    bitwise, in the order of trace a. A nested jit (its equations are the detail), an
    equation of a call whose compiled outputs are equal (the script never saw it) and a
    nondeterministic op (`--noise`) are left out."""
    differs = differing_mask(d)
    ia, ib = d.pairs()
    kinds = d.sa.kind
    noisy = getattr(d, "noisy", None)
    out = []
    for ea, eb in zip(ia.tolist(), ib.tolist()):
        if kinds[ea] not in _COMPUTING or not differs[ea]:
            continue
        if noisy is not None and noisy[ea]:
            continue
        op = d.ta.string(d.ta.events[ea]["op"])
        if _CONTAINERS.match(op) or op in _IDENTITY or _unseen(d, ea):
            continue
        try:
            match = d.inputs_match(ea, eb, BITWISE)[0]
        except Exception:   # an odd input row: judged as inheriting (never a false source)
            match = False
        if match is None and is_initialiser(d.ta, ea):
            match = True   # an RNG op writes over what it reads (normal_ on empty memory)
        if match is None:
            continue
        out.append((ea, eb, bool(match)))
    return out


def _unseen(d, ea):
    """An equation whose enclosing top-level call's compiled outputs are bitwise equal."""
    call = int(d.ta.events[ea]["call"])
    if d.sa.kind[ea] != schema.KIND_EQN or call < 0 or call >= len(d.ta):
        return False
    cb = int(d.al.a2b[call])
    return cb >= 0 and bool(d.sa.content[call] == d.sb.content[cb])


def _ancestor_ops(t, ev):
    """The op names of the event and its enclosing calls and nested jits."""
    ops, seen = [], 0
    while 0 <= ev < len(t) and seen < 64:
        ops.append(t.string(t.events[ev]["op"]))
        ev = int(t.events[ev]["parent"])
        seen += 1
    return ops


def is_initialiser(t, ev) -> bool:
    """True for an RNG or initialiser op, or an op inside an initialiser's call."""
    return any(_INIT.match(op) for op in _ancestor_ops(t, ev))


def _cluster_key(d, ea, inputs_equal):
    e = d.ta.events[ea]
    module = _DIGITS.sub("*", d.ta.string(e["name_stack"]))
    init = is_initialiser(d.ta, ea)
    return (d.ta.string(e["op"]), module, int(e["phase"]), init, inputs_equal)


def _l2(x):
    return float(np.sqrt(np.sum(np.square(np.asarray(x, np.float64)))))


def _floating(x):
    return x is not None and compare.is_floating(np.asarray(x).dtype.name) and \
        np.asarray(x).dtype.kind != "c"


class _Cluster:
    """Differing events of one op in one module pattern and phase: replayed on a sample,
    judged source or inherited, weighed."""

    def __init__(self, key, members):
        self.op, self.module, self.phase, self.init, self.inputs_equal = key
        self.members = members
        self.judged = []          # [(ea, eb, Measure)] of the replayed/compared events
        self.mechanism = ""       # short key: bf16_inputs, initialiser, fma, ...
        self.mechanism_text = ""
        self.side = ""            # "a", "b" or "both"
        self.framework = ""
        self.rv = None

    def sample(self, n):
        m = self.members
        if len(m) <= n:
            return list(m)
        idx = np.unique(np.linspace(0, len(m) - 1, n).round().astype(int))
        return [m[i] for i in idx]

    def measure(self, d, full, budget):
        """Measure a sample of the cluster; returns the replays spent."""
        spent = 0
        for ea, eb, equal in self.sample(min(SAMPLE, max(budget, 1))):
            m = _measure(d, ea, eb, equal, full and budget - spent > 0)
            spent += m.replayed
            self.judged.append((ea, eb, m))
        return spent

    def sources(self):
        return [(ea, eb, m) for ea, eb, m in self.judged if m.source]

    def is_source(self):
        return bool(self.sources())

    @property
    def weight(self):
        src = self.sources()
        if not src:
            return 0.0
        mean = float(np.mean([m.added_rel for _, _, m in src]))
        # the members not judged are counted at the judged sources' mean, scaled by the
        # fraction of judged members that were sources
        frac = len(src) / len(self.judged)
        return mean * len(self.members) * frac

    @property
    def worst(self):
        return max(self.sources(), key=lambda x: x[2].added_rel)

    def name_mechanism(self, d, explain):
        ea, eb, m = self.worst
        self.side = m.side
        self.framework = schema.FW_NAMES.get(int(d.ta.events[ea]["framework"]), "")
        if self.init:
            self.mechanism = "initialiser"
            self.mechanism_text = ("the initialiser differs: an RNG or initialiser op computes "
                                   "its values differently on the two sides")
            return
        bf16 = _bf16_side(d, ea, eb)
        if bf16:
            self.mechanism, self.side = "bf16_inputs", bf16
            self.mechanism_text = (f"a bf16 pass on {bf16}: float32 products computed from "
                                   f"bfloat16-rounded inputs ({DESCRIPTIONS['bf16_inputs']})")
            return
        if explain:
            try:
                self.rv = replay_verdict(d, ea, eb)
            except Exception:  # a mechanism is a bonus: never fail the sources over it
                self.rv = None
        name = _best_hypothesis(self.rv, self.side)
        if name:
            self.mechanism = name
            self.mechanism_text = DESCRIPTIONS.get(name, name)
        else:
            cls = op_class(self.op)
            self.mechanism = f"implementation:{cls}"
            self.mechanism_text = (f"{'the op' if self.side == 'both' else self.side + chr(39) + 's op'} "
                                   f"computes differently ({cls}: another kernel, "
                                   f"instruction set or library version; no candidate "
                                   f"numerics reproduce it bitwise)")


class Measure:
    """One event judged: source or not, which side, local errors, the relative difference
    it adds where it acts."""

    __slots__ = ("source", "side", "local_a", "local_b", "added_rel", "diff_rel", "replayed",
                 "reason", "reproduced", "sq_diff", "sq_out")

    def __init__(self):
        self.source, self.side = False, ""
        self.sq_diff = self.sq_out = 0.0   # ||out_a - out_b||^2, ||out_a||^2 (introduced)
        self.local_a = self.local_b = None
        self.added_rel = self.diff_rel = 0.0
        self.replayed = 0
        self.reason = ""
        self.reproduced = (None, None)


def _replay_here(d, side, ev):
    """(call, inputs, recorded outputs, reproduced) of one side's event re-run here in its
    dtype from its own recorded inputs; reproduced is None when it was computed on another
    backend (a TPU's values replayed on a CPU say nothing of the TPU). Raises CannotReplay."""
    t = d.ta if side == "a" else d.tb
    e = t.event(ev)
    inputs = event_inputs(d, side, ev)
    call = _replay.build_call(e["framework"], e["op"], e["params"], len(inputs),
                              _replay.recorded_output_size(t, ev))
    recorded = event_outputs(d, side, ev)
    there, mine = recorded_backend(t, e["framework"]), replay_backend(e["framework"])
    if there and mine and there != mine:
        return call, inputs, recorded, None
    here = call.run(inputs)
    reproduced = len(here) == len(recorded) and all(
        r is not None and np.shape(h) == np.shape(r) and
        np.asarray(h).dtype == np.asarray(r).dtype and
        np.asarray(h).tobytes() == np.asarray(r).tobytes() for h, r in zip(here, recorded))
    return call, inputs, recorded, reproduced


def _measure(d, ea, eb, inputs_equal, replay):
    """Judge one differing event (see the module docstring)."""
    m = Measure()
    oa, ob = event_outputs(d, "a", ea), event_outputs(d, "b", eb)
    pairs = [(x, y) for x, y in zip(oa, ob) if _floating(x) and _floating(y) and
             np.shape(x) == np.shape(y)]
    if inputs_equal:
        m.source, m.side = True, "both"
        if pairs:
            num = _l2(np.concatenate([(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                                      .ravel() for x, y in pairs]))
            den = _l2(np.concatenate([np.asarray(x, np.float64).ravel() for x, _ in pairs]))
            m.added_rel = m.diff_rel = num / den if den > 0 else float(num > 0)
            m.sq_diff, m.sq_out = num * num, den * den
        else:
            m.added_rel = m.diff_rel = _metric_rel(d, ea, eb)
        return m
    op = d.ta.string(d.ta.events[ea]["op"])
    if not replay or not pairs or not rounds_its_own(op):
        m.reason = "not replayed" if rounds_its_own(op) else \
            "a single correctly rounded operation or a copy: it cannot compute differently"
        return m
    try:
        here_a = _replay_here(d, "a", ea)
        here_b = _replay_here(d, "b", eb)
    except Exception as exc:   # CannotReplay, or an odd value: not judged (never a source)
        m.reason = f"not replayed: {str(exc)[:80]}"
        return m
    m.replayed = 2
    ra, rb = m.reproduced = (here_a[3], here_b[3])
    if ra and rb:
        m.reason = "both sides reproduced here: the op computes the same way on both"
        return m
    try:
        _local(m, here_a, here_b)
    except Exception as exc:   # the float64 run failed: not judged
        m.reason = f"no exact result: {str(exc)[:80]}"
        return m
    if not m.added_rel and m.local_a is None:
        return m
    la, lb = m.local_a or 0.0, m.local_b or 0.0
    lo, hi = min(la, lb), max(la, lb)
    differently = ra is False or rb is False or (m.local_a is not None and
                                                  hi >= LOCAL_RATIO * max(lo, 1e-300))
    if differently and m.added_rel > 0:
        m.source = True
        m.side = ("b" if ra and rb is False else "a" if rb and ra is False else
                  "a" if la > lb else "b")
    return m


def _local(m, here_a, here_b):
    """Fill in the local errors (relative L2 of recorded - exact(own inputs)) of both sides
    and the relative difference the op adds (`local_a - local_b`)."""
    outs = []
    for call, inputs, recorded, _ in (here_a, here_b):
        outs.append((recorded, call.run(inputs, upcast=True)))
    (rec_a, ex_a), (rec_b, ex_b) = outs
    la, lb, added, diff, norm = [], [], [], [], []
    for ra, xa, rb, xb in zip(rec_a, ex_a, rec_b, ex_b):
        if not (_floating(ra) and _floating(rb)) or np.shape(ra) != np.shape(rb) or \
                np.shape(xa) != np.shape(ra) or np.shape(xb) != np.shape(rb):
            continue
        ra64, rb64 = np.asarray(ra, np.float64), np.asarray(rb, np.float64)
        xa64, xb64 = np.asarray(xa, np.float64), np.asarray(xb, np.float64)
        with np.errstate(all="ignore"):
            ea_, eb_ = ra64 - xa64, rb64 - xb64
        ok = np.isfinite(ea_) & np.isfinite(eb_)
        la.append(np.where(ok, ea_, 0).ravel())
        lb.append(np.where(ok, eb_, 0).ravel())
        added.append(np.where(ok, ea_ - eb_, 0).ravel())
        diff.append(np.where(ok, ra64 - rb64, 0).ravel())
        norm.append(np.where(ok, xa64, 0).ravel())
    if not la:
        m.reason = "no floating outputs to measure"
        return
    den = _l2(np.concatenate(norm)) or 1.0
    if np.asarray(rec_a[0]).dtype.itemsize < 8:   # float64 ops: "exact" is this machine's own
        m.local_a = _l2(np.concatenate(la)) / den
        m.local_b = _l2(np.concatenate(lb)) / den
    m.added_rel = _l2(np.concatenate(added)) / den
    m.diff_rel = _l2(np.concatenate(diff)) / den


# JAX primitives that are one correctly rounded IEEE operation (or exact): every machine
# computes them alike from the same inputs, so they only carry what they inherit (denormals
# flushed to zero aside)
_EXACT_JAX = frozenset("""
add add_any sub mul div neg abs max min sqrt select_n sign floor ceil round convert_element_type
square clamp nextafter rem copy copy_p eq ne lt le gt ge and or not xor
""".split())


def rounds_its_own(op) -> bool:
    """False for an op that cannot compute differently on two machines from the same
    inputs: a copy, view or selection, or a single correctly rounded JAX operation."""
    base = _args.base_name(op)
    return base not in _args.DATA_MOVEMENT and op not in _EXACT_JAX


def _metric_rel(d, ea, eb):
    """The worst relative difference of a pair from the comparison (hash-and-statistics
    traces: a bound from the statistics), 1.0 when none is known."""
    try:
        metrics = d.compare_event(ea, eb).get("metrics") or {}
    except Exception:   # an odd row: the source is kept, its weight unknown
        metrics = {}
    rel = metrics.get("max_rel")
    return float(rel) if rel is not None and np.isfinite(rel) else 1.0


def _bf16_side(d, ea, eb):
    """The side whose matmul or convolution ran as a bf16 pass on a TPU (default
    precision) while the other's did not; "" when not that."""
    bf16 = {}
    for side, t, ev in (("a", d.ta, ea), ("b", d.tb, eb)):
        e = t.event(ev)
        if e["framework"] != "jax":
            bf16[side] = False
            continue
        jax_manifest = ((t.manifest or {}).get("frameworks") or {}).get("jax") or {}
        try:
            params = _replay.parse_params(e["params"])
        except Exception:   # unparseable: the op's precision is unknown, default assumed
            params = {}
        bf16[side] = bool(ran_as_bf16_pass(str(jax_manifest.get("backend") or ""), e["op"],
                                           params,
                                           jax_manifest.get("jax_default_matmul_precision")))
    if bf16["a"] != bf16["b"]:
        return "a" if bf16["a"] else "b"
    return ""


def _best_hypothesis(rv, side):
    """The hypothesis that reproduces the culprit side bitwise (or, for both sides, either),
    from a replay verdict's mechanisms; None when none does."""
    if rv is None or not rv.mechanisms:
        return None
    sides = ("a", "b") if side in ("both", "") else (side,)
    for s in sides:
        mine = [mm for mm in rv.mechanisms if mm.side == s]
        if mine and mine[0].bitwise:
            return mine[0].name
    return None


# -- grouping, fixes, counterfactual runs ---------------------------------------------------------

def _group(d, result, clusters):
    """Sources from clusters: one per (mechanism, side, and op class for an unnamed
    implementation), ranked by share."""
    groups = collections.OrderedDict()
    for cl in clusters:
        key = (cl.mechanism, cl.side, "introduced" if cl.inputs_equal else "adds")
        groups.setdefault(key, []).append(cl)
    total = sum(cl.weight for cl in clusters) or 1.0
    out = []
    for (mech, side, how), members in groups.items():
        weight = sum(cl.weight for cl in members)
        events = [ea for cl in members for ea, _, _ in cl.members]
        steps = sorted({int(d.ta.events[e]["step"]) for e in events})
        ops = collections.Counter()
        for cl in members:
            ops[cl.op] += len(cl.members)
        modules = []
        for cl in members:
            if cl.module and cl.module not in modules:
                modules.append(cl.module)
        judged = [m for cl in members for _, _, m in cl.sources()]
        la = [m.local_a for m in judged if m.local_a is not None]
        lb = [m.local_b for m in judged if m.local_b is not None]
        worst = max(members, key=lambda c: c.weight).worst
        lead = members[0]
        src = Source(
            rank=0, share=weight / total, weight=weight, mechanism=mech,
            mechanism_text=lead.mechanism_text, side=side, how=how,
            ops=[[op, n] for op, n in ops.most_common()], modules=modules[:8],
            steps=[steps[0], steps[-1]] if steps else [], events=len(events),
            replayed=sum(1 for cl in members for _, _, m in cl.judged if m.replayed),
            local_a=max(la) if la else None, local_b=max(lb) if lb else None,
            added=max(m.added_rel for m in judged) if judged else None,
            event_a=int(worst[0]), event_b=int(worst[1]),
            first_event=int(min(events)))
        out.append((src, lead))
    out = [src for src, _ in _with_fixes(d, result, clusters, out)]
    out.sort(key=lambda s: -s.share)
    for i, s in enumerate(out, 1):
        s.rank = i
    return out


def _with_fixes(d, result, clusters, pairs):
    """Shares (the initialiser's from its initial values as a whole), then each source's
    fix, counterfactual and text (the counterfactual names the share it should remove)."""
    _initial_values_share(clusters, [src for src, _ in pairs])
    for src, lead in pairs:
        src.fix, src.counterfactual, src.causes = _fix(d, result, lead, src)
        src.text = _text(src)
    return pairs


def _initial_values_share(clusters, sources):
    """Reweigh the initialiser: its weight is the relative difference of the initial values
    as a whole (||out_a - out_b|| / ||out_a|| over every RNG output it judged), not a sum
    over its events: the initial parameters differ once, by that much, whatever number of
    tensors they come in. Summed per event, 19 tensors 1 ULP apart outweighed the kernels
    that Adam's steps feed every step (a GPT trained 3 steps: the counterfactual run with
    the same initial parameters keeps 99.5 % of the difference)."""
    init = [s for s in sources if s.mechanism == "initialiser"]
    if not init:
        return
    sq_diff = sum(m.sq_diff for cl in clusters if cl.init for _, _, m in cl.sources())
    sq_out = sum(m.sq_out for cl in clusters if cl.init for _, _, m in cl.sources())
    if sq_out <= 0:
        return
    whole = float(np.sqrt(sq_diff / sq_out))
    w_init = sum(s.weight for s in init) or 1.0
    for s in init:
        s.weight = whole * s.weight / w_init
    total = sum(s.weight for s in sources) or 1.0
    for s in sources:
        s.share = s.weight / total


def _fix(d, result, cl, src):
    """(fix, counterfactual command lines, cause keys) of a source."""
    argv_side = src.side if src.side in ("a", "b") else "b"
    t = d.ta if argv_side == "a" else d.tb
    argv = shell.script_argv(t.manifest) or ["SCRIPT.py"]
    out = f"{argv_side}.counterfactual.h5"
    other = d.tb.path if argv_side == "a" else d.ta.path
    if src.mechanism == "initialiser":
        return ("initialise the parameters once, save them (np.savez, torch.save, a "
                "checkpoint) and load them in both runs; or initialise on one device and copy",
                [shell.comment(f"re-run {argv_side} with the other run's initial parameters "
                               f"loaded from a file (a change to the script): the difference "
                               f"left is what the other sources make")], [])
    if src.mechanism == "bf16_inputs":
        fw = cl.framework or "jax"
        fix = fix_for("bf16_inputs", fw) or "run the matmuls and convolutions in float32"
        if fw == "jax":
            lines = shell.record_command(argv, out, {"JAX_DEFAULT_MATMUL_PRECISION": "highest"})
            lines.append(shell.with_comment(shell.command("tracediff", "locate", other, out),
                                            f"should remove ~{src.share:.0%} of the difference"))
            return fix, lines, ["frameworks.jax.backend"]
        return fix, [], []
    causes = environment(result.env_diff, cl.op, cl.framework, cl.inputs_equal, cl.rv)
    keys = [c.key for c in causes.causes[:3]]
    env_cause = next((c for c in causes.causes if c.key.startswith("env.")), None)
    if env_cause is not None:
        var = env_cause.key[len("env."):]
        mine = env_cause.a if argv_side == "b" else env_cause.b   # the other side's value
        fix = f"the same {var} on both machines (a: {env_cause.a!s}, b: {env_cause.b!s})"
        if isinstance(mine, str):
            lines = shell.record_command(argv, out, {var: mine})
            lines.append(shell.with_comment(shell.command("tracediff", "locate", other, out),
                                            f"should remove ~{src.share:.0%} of the difference"))
        else:
            lines = [shell.comment(f"re-run {argv_side} with {var} unset, then locate again: "
                                   f"should remove ~{src.share:.0%} of the difference")]
        return fix, lines, keys
    if causes.causes:
        c = causes.causes[0]
        return (f"align {c.key} ({c.a} vs {c.b}) between the two machines", [], keys)
    st = result.structural
    if st is not None:   # an op only one run executed changed the values before this one
        return (f"none from the environment: it follows {st.text}, an op the other run did "
                f"not execute", [], [])
    return ("no recorded environment difference explains it (hardware, or a library loaded "
            "at run time)", [], [])


def _ops_text(ops):
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops[:4]) + \
        (f", +{len(ops) - 4} more ops" if len(ops) > 4 else "")


def _text(s):
    """One line for the terminal: share, mechanism, side, ops, where, how large."""
    who = "in RNG and initialiser ops" if s.mechanism == "initialiser" else \
        {"a": "on a", "b": "on b", "both": "introduced (inputs bitwise equal)"}.get(s.side, "")
    steps = "" if not s.steps else (f"step {s.steps[0]}" if s.steps[0] == s.steps[1] else
                                   f"steps {s.steps[0]}-{s.steps[1]}")
    mech = "initialiser" if s.mechanism == "initialiser" else \
        "bf16 pass" if s.mechanism == "bf16_inputs" else s.mechanism.replace("implementation:",
                                                                             "implementation, ")
    local = ""
    if s.local_a is not None and s.local_b is not None and s.how == "adds":
        local = f"; local error a {s.local_a:.2g} / b {s.local_b:.2g}"
    return (f"{s.share:6.1%}  {mech} {who}: {_ops_text(s.ops)} in "
            f"{', '.join(s.modules[:3]) or '(top level)'}{' ...' if len(s.modules) > 3 else ''}"
            f"; {steps}; adds up to {s.added:.2g} rel{local}" if s.added is not None else
            f"{s.share:6.1%}  {mech} {who}: {_ops_text(s.ops)}; {steps}")
