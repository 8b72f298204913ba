"""Every source of a difference between two runs, ranked by its estimated share.

`locate` names the first difference, and the first is often the least: a CNN on a TPU against
a CPU differs first in its initialiser (1 ULP) while the convolutions' bf16 passes make 99 % of
the final difference. `find(d, result)` looks at every paired event whose outputs differ and
keeps those where a difference *enters*:

* **introduced**: its inputs are bitwise equal and its outputs differ (hashes decide, so this
  holds at every recording level);
* **adds beyond what it inherits**: its inputs already differ, and the op itself computes
  differently on the two sides. Each side's op is re-run here on that side's own recorded
  inputs (`explain/replay/`), in its dtype and in float64. Where this machine reproduces
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

from ...trace import schema
from ..differ import BITWISE
from ..result import Source, Sources
from . import source_fixes, source_kinds
from .causes import op_class
from .chain import consumers, differing_mask
from .local_error import measure_compiled, measure_event
from .mechanisms.dispatch import DESCRIPTIONS
from .verdict import replay_verdict

                       # differently (compiled alike, nearly equal inputs round nearly alike)
SAMPLE = 3             # events replayed per cluster
MAX_REPLAYED = 240     # events replayed in all
MAX_EXPLAINED = 8      # clusters whose mechanism is named by the full replay verdict

# RNG and initialiser ops: a difference there is "the initialiser differs"
_INIT = re.compile(
    r"^(aten::)?(jit:)?_?(truncated_normal|normal_real|normal|uniform|orthogonal|"
    r"random_\w+|threefry\w*|bernoulli_?|exponential_|random_|randn\w*|rand\w*|randint\w*|"
    r"randperm\w*|normal_|uniform_|trunc_normal_|kaiming\w*|xavier\w*|variance_scaling\w*|"
    r"lecun\w*|glorot\w*|he_\w+)$")
# torch's RNG fills: their outputs never depend on the values they overwrite
_FILLS = frozenset({"aten::normal_", "aten::uniform_"})
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
    compiled = _compiled_clusters(d) if full else []
    for cl in compiled:
        cl.measure(d, full, budget)
    measured += compiled
    found = [cl for cl in measured if cl.is_source()]
    out.replayed = MAX_REPLAYED - budget
    out.not_judged = _not_judged(measured, found) + _compiled_calls(compiled)
    if not found:
        out.note = _unpaired(d) or (
            "every difference is inherited: no paired op adds one of its own that could be "
            "measured" if full else "no op whose inputs are bitwise equal has outputs that differ")
        return out
    found.sort(key=lambda c: -c.weight)
    for i, cl in enumerate(found):
        cl.name_mechanism(d, explain=i < MAX_EXPLAINED)
    out.sources, estimator, out.no_shares = _group(d, result, found)
    if estimator:
        out.estimator, out.initialiser_followed = estimator, True
    out.bound = not full
    if not full:
        out.note = ("stats-level traces hold hashes and statistics, not values: only ops "
                    "whose inputs are bitwise equal are found, and their shares are bounds "
                    "from the statistics")
    return out


def _unpaired(d):
    """Where no paired op adds a difference but the runs executed different ops (an op
    called with another slice, shape or flag is another event to the alignment): the
    difference enters there, in what was not paired; "" where every event was paired."""
    gaps = getattr(d.al, "gaps", None)
    runs = gaps(1) if gaps is not None else []
    if not runs:
        return ""
    parts = []
    for g in runs:
        t = d.ta if g["side"] == "a" else d.tb
        parts.append(f"{g['length']} events only in {g['side']} from #{g['start']} "
                     f"({t.string(t.events[g['start']]['op'])})")
    return ("no paired op adds a difference of its own: it enters where the runs executed "
            "different ops, which are not paired (" + "; ".join(parts) + ")")


def _not_judged(clusters, found):
    """[[op, events, reason]] of the clusters that computing ops whose local error could not
    be measured (not replayable here): the shares are of what was measured, and say so."""
    out = []
    for cl in clusters:
        if cl in found or cl.inputs_equal or isinstance(cl, _CompiledCluster):
            continue   # (compiled calls: `_compiled_calls`)
        reasons = [m.reason for _, _, m in cl.judged if m.reason.startswith(("not replayed:",
                                                                              "no exact"))]
        if reasons and len(reasons) == len(cl.judged):
            out.append([cl.op, len(cl.members), reasons[0]])
    merged = collections.OrderedDict()
    for op, n, why in out:
        k = (op, why)
        merged[k] = merged.get(k, 0) + n
    return [[op, n, why] for (op, why), n in merged.items()]


def _compiled_calls(compiled):
    """[[what, calls, why]] for the compiled jit calls whose fusion could not be measured
    (no replayed equation gives their outputs): the shares leave out what their compiled
    programs add."""
    n = sum(1 for cl in compiled for _, _, m in cl.judged if not m.replayed)
    if not n:
        return []
    return [["compiled jit calls", n, "no replayed equation gives their outputs: what the "
             "compiled program adds (fusion, FMA contraction) is not measured"]]


def _compiled_clusters(d):
    """Clusters of the paired compiled calls whose outputs differ while their inputs differ
    too (a call with equal inputs is judged through its equations, `_candidates`), one per
    jitted function."""
    differs = differing_mask(d)
    ia, ib = d.pairs()
    by_op = collections.OrderedDict()
    for ea, eb in zip(ia.tolist(), ib.tolist()):
        if d.sa.kind[ea] != schema.KIND_CALL or not differs[ea]:
            continue
        op = d.ta.string(d.ta.events[ea]["op"])
        if is_initialiser(d.ta, ea):
            continue
        by_op.setdefault(op, []).append((ea, eb, False))
    return [_CompiledCluster(op, members) for op, members in by_op.items()]


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
        if (match is None and is_initialiser(d.ta, ea)) or op in _FILLS:
            match = True   # an RNG op writes over what it reads (normal_ on empty memory,
            # or HF's `_init_weights` re-drawing a weight the constructor drew first)
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


# a module library's own file: an RNG op run there initialises a module's parameters
_MODULE_LIB = re.compile(r"[/\\](flax|haiku|equinox)[/\\]")


def _random_data(op, module, framework, lib_source=""):
    """An RNG op that draws data rather than parameters: in JAX, one outside any module
    (Flax linen initialises inside the module's name stack) and not run from a module
    library's file (NNX has no name stack: its `nnx.Linear` draws in flax/nnx/nn/linear.py);
    in torch, one that makes a new tensor (`randn`) rather than filling a parameter in place
    (`normal_`)."""
    if framework == "torch":
        return not op.split("::", 1)[-1].split(".", 1)[0].endswith("_")
    return not module and not _MODULE_LIB.search(lib_source or "")


def reaches_parameters(d, ev, hops=16) -> bool:
    """Does a JAX draw of trace a outside any module become a parameter: does a value it
    leads to in the dataflow (`chain.consumers`: through the equations of its call, the
    call, then eager ops: a scale, a reshape, as `jax.nn.initializers` at top level)
    equal, by hash, a parameter of the first optax step? Constant parameters (zeros,
    ones) are left out: any constant has their hash. Then it is the initialiser, not
    random data."""
    if getattr(d, "_drawn_params", None) is None:
        t = d.ta
        optim = np.flatnonzero(t.events["kind"] == schema.KIND_OPTIM)
        hashes = set()
        for r in (t.value_rows(int(optim[0]), None) if len(optim) else ()):
            if not (t.string(r["name"]).startswith("params/") and int(r["hash"])):
                continue
            try:   # a constant parameter (zeros, ones) is any constant's hash: not drawn
                x = np.asarray(d.ra.read(r))
                if x.size and np.all(x == x.flat[0]):
                    continue
            except Exception:   # no bytes (stats level): the hash alone
                pass
            hashes.add(int(r["hash"]))
        d._drawn_params = (hashes, consumers(d) if hashes else None)
    hashes, graph = d._drawn_params
    if not hashes:
        return False
    starts, targets = graph
    kind = d.sa.kind
    frontier, seen = {int(ev)}, set()
    for _ in range(hops):
        nxt = set()
        for e in frontier - seen:
            seen.add(e)
            if any(int(r["hash"]) in hashes for r in d.ta.value_rows(e, schema.ROLE_OUT)):
                return True
            nxt.update(x for x in targets[starts[e]:starts[e + 1]].tolist()
                       if int(kind[x]) != schema.KIND_OPTIM)
        if not nxt:
            return False
        frontier = nxt
    return False


def _cluster_key(d, ea, inputs_equal):
    e = d.ta.events[ea]
    module = _DIGITS.sub("*", d.ta.string(e["name_stack"]))
    init = is_initialiser(d.ta, ea)
    # a JAX draw outside any module: a parameter's (the initialiser) or the data's
    param = bool(init and not module and int(e["framework"]) == schema.FW_JAX and
                 reaches_parameters(d, ea))
    return (d.ta.string(e["op"]), module, int(e["phase"]), init, inputs_equal, param)


class _Cluster:
    """Differing events of one op in one module pattern and phase: replayed on a sample,
    judged source or inherited, weighed."""

    def __init__(self, key, members):
        self.op, self.module, self.phase, self.init, self.inputs_equal = key[:5]
        self.members = members
        self.judged = []          # [(ea, eb, Measure)] of the replayed/compared events
        self.mechanism = ""       # short key: dtype, bf16_inputs, initialiser, fma, ...
        self.mechanism_text = ""
        self.side = ""            # "a", "b" or "both"
        self.framework = ""
        self.arguments = ""       # the arguments that differ (mechanism "arguments")
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
            m = measure_event(d, ea, eb, equal, full and budget - spent > 0)
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
        self._name(d, ea, eb, explain)
        values = source_kinds.value_words(d, ea, eb)
        if values:
            self.mechanism_text = f"{values}; {self.mechanism_text}"

    def _name(self, d, ea, eb, explain):
        changed = self.arguments = source_kinds.arguments(d, ea, eb)
        if changed:   # the program asked for another computation: never the hardware
            self.mechanism, self.side = "arguments", "both"
            self.mechanism_text = (f"the op's arguments differ: {changed} (a difference in "
                                   f"the program or its inputs, not in how the op computes)")
            return
        lib = d.ta.event(ea).get("lib_source", "") if self.init else ""
        if self.init and _random_data(self.op, self.module, self.framework, lib) and \
                not (self.framework == "jax" and reaches_parameters(d, ea)):
            self.mechanism = "random_data"
            self.mechanism_text = ("the random data differ: an RNG op drawing the program's "
                                   "inputs (not a module's parameters) computes its values "
                                   "differently on the two sides")
            return
        if self.init:
            self.mechanism = "initialiser"
            self.mechanism_text = ("the initialiser differs: an RNG or initialiser op computes "
                                   "its values differently on the two sides")
            return
        cast, narrow = source_kinds.dtype_change(d, ea, eb)
        if cast:
            self.mechanism, self.side = "dtype", narrow
            self.mechanism_text = f"computed in another dtype ({cast})"
            return
        bf16 = source_kinds.bf16_side(d, ea, eb)
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
        name = source_kinds.best_hypothesis(self.rv, self.side)
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


class _CompiledCluster(_Cluster):
    """The compiled calls of one jitted function: what the compiled program adds beyond its
    equations run one by one (fusion), measured on each side as compiled - replayed."""

    def __init__(self, op, members):
        super().__init__((op, "", schema.PHASE_FWD, False, False), members)

    def measure(self, d, full, budget):
        for ea, eb, _ in self.sample(SAMPLE):
            self.judged.append((ea, eb, measure_compiled(d, ea, eb)))
        return 0

    def name_mechanism(self, d, explain):
        ea, eb, m = self.worst
        self.side, self.framework = m.side, "jax"
        self.mechanism = "fusion"
        self.mechanism_text = (f"{m.side}'s compiled program computes differently from its "
                               f"equations run one by one: fusion (a multiply and an add "
                               f"contracted into one FMA, reductions reassociated or "
                               f"vectorised), where the other side's does not or less")


# -- grouping, fixes, counterfactual runs ---------------------------------------------------------

def _group(d, result, clusters):
    """Sources from clusters: one per (mechanism, side, and op class for an unnamed
    implementation), ranked by share; how the shares were estimated (None: the default,
    `Sources.estimator`); why no shares were given ("" where they were)."""
    groups = collections.OrderedDict()
    for cl in clusters:
        key = (cl.mechanism, "", "", "") if cl.init else \
            (cl.mechanism, cl.side, "introduced" if cl.inputs_equal else "adds",
             cl.arguments)   # each set of differing arguments is a change of its own
        groups.setdefault(key, []).append(cl)
    total = sum(cl.weight for cl in clusters) or 1.0
    out = []
    for (mech, side, how, _), members in groups.items():
        if not how:   # random numbers: one source, whatever the sides of its ops
            how = "introduced" if all(cl.inputs_equal for cl in members) else "adds"
            sides = {cl.side for cl in members}
            side = "both" if how == "introduced" else sides.pop() if len(sides) == 1 else \
                "both"
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
            first_event=int(min(events)), arguments=lead.arguments if mech == "arguments" else "")
        out.append((src, lead))
    estimator, no_shares = _with_fixes(d, result, clusters, out)
    out = [src for src, _ in out]
    out.sort(key=lambda s: (s.share is None, -(s.share or 0.0), s.first_event))
    for i, s in enumerate(out, 1):
        s.rank = i
    return out, estimator, no_shares


def _with_fixes(d, result, clusters, pairs):
    """Shares (the initialiser's from its initial values as a whole, or followed to the
    final parameters where both runs hold them), then each source's fix, counterfactual
    and text (the counterfactual names the part it should remove). Returns how the shares
    were estimated, where it is not the default (`Sources.estimator`), and why none were
    given ("" where they were)."""
    _initial_values_share(clusters, [src for src, _ in pairs])
    estimator = _carried_initial_share(d, [src for src, _ in pairs])
    no_shares = _shares_or_none([src for src, _ in pairs])
    for src, lead in pairs:
        src.fix, src.counterfactual, src.causes = source_fixes.fix(d, result, lead, src)
        src.text = source_fixes.source_line(src)
    return estimator, no_shares


def _shares_or_none(sources):
    """Shares that are finite and add up to 1, or none at all (`Source.share` None) and
    the reason why (returned, else ""): a difference that is not finite (a NaN or Inf against a
    number) cannot be weighed against finite ones, and differences of no magnitude (the
    sign of zero) have nothing to share. A single source has the whole difference."""
    shares = [s.share for s in sources]
    if len(sources) == 1:
        sources[0].share = 1.0
        return ""
    if all(x is not None and np.isfinite(x) for x in shares) and \
            abs(sum(shares) - 1.0) < 1e-6:
        return ""
    weights = [s.weight for s in sources]
    why = ("a difference is not finite (NaN or Inf against a number): it cannot be "
                   "weighed against the finite ones" if not all(np.isfinite(weights)) else
           "the differences have no magnitude (the sign of zero): nothing to share")
    for s in sources:
        s.share = None
    return why


def _initial_values_share(clusters, sources):
    """Reweigh the random numbers (initialiser, random data): each one's weight is the
    relative difference of its values as a whole (||out_a - out_b|| / ||out_a|| over every
    RNG output it judged with bitwise equal inputs), not a sum over its events: the initial parameters differ once, by that much, whatever number of
    tensors they come in. Summed per event, 19 tensors 1 ULP apart outweighed the kernels
    that Adam's steps feed every step (a GPT trained 3 steps: the counterfactual run with
    the same initial parameters keeps 99.5 % of the difference)."""
    rng = [s for s in sources if s.mechanism in ("initialiser", "random_data")]
    if not rng:
        return
    for src in rng:
        mine = [m for cl in clusters if cl.init and cl.mechanism == src.mechanism
                for _, _, m in cl.sources()]
        sq_out = sum(m.sq_out for m in mine)
        if sq_out > 0:
            src.weight = float(np.sqrt(sum(m.sq_diff for m in mine) / sq_out))
    total = sum(s.weight for s in sources) or 1.0
    for s in sources:
        s.share = s.weight / total


def _carried_initial_share(d, sources):
    """The initialiser's share followed forward. Summed where they act, many kernels' 1-ULP
    differences outweighed the initial parameters' one (an NNX MLP, a CNN under SSE4.2: the
    same initial parameters remove 66-70 % of the final difference; the initialiser was
    ranked last). Where both runs are optax runs with bytes, the initial parameters'
    difference `Di` is what the final parameters' difference `Df` starts from: its share is
    its projection on it, <Di, Df> / ||Df||^2 (of the square, as independent sources add),
    and the other sources share the rest by their weights."""
    init = next((s for s in sources if s.mechanism == "initialiser"), None)   # one at most
    rest = [s for s in sources if s.mechanism != "initialiser"]
    if init is None:
        return None
    try:
        params = d.initial_and_final_parameters()
    except Exception:   # an odd pair of traces: keep the estimate where sources act
        return None
    di = sum(float(np.sum((ia - ib) * (fa - fb))) for _, ia, ib, fa, fb in params)
    df = sum(float(np.sum((fa - fb) ** 2)) for _, _, _, fa, fb in params)
    if not params or df <= 0 or not np.isfinite(di / df):
        return None
    share = min(1.0, max(0.0, di / df)) if rest else 1.0
    init.share = share
    total = sum(s.weight for s in rest) or 1.0
    for s in rest:
        s.share = (1.0 - share) * s.weight / total
    return (
        f"the initialiser: the initial parameters' difference followed to the final "
        f"parameters (its projection on their difference: {share:.1%} of its square, "
        f"{len(params)} tensors); the other sources share the rest by the relative difference "
        f"each adds where it acts, summed over its events; a run without a source keeps "
        f"sqrt(1 - share) of the final relative L2")
