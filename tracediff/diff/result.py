"""The result of comparing two traces: typed objects that every renderer takes.

`LocateResult` is what `tracediff.locate()` returns and what the terminal, Markdown, HTML
and JSON renderers (in `report/`) render; `Finding` is one located divergence in it, with
its two events (`EventRef`), its `Metrics` (real floats: `math.inf` for a NaN against a
number), and `ValueComparison`s per output. `Replay` is locate's short replay verdict of
the origin, `Hop` and `Gap` its chain from the origin to the outputs; `Analysis` is the
whole of what `tracediff explain` computes (replay run, causes, per-step table). `Levels`
says what each side was recorded with and how to zoom in.

JSON is made only at the edge (`report.json_report`: `build`, `analysis_json`,
`tracediff.to_json`), which also decides which keys appear; nothing here is a dict of
dicts. For code written against the dicts of earlier versions, the types that replaced a
dict also read by key (`finding.a["op"]` is `finding.a.op`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union


class _ByKey:
    """Read access by key next to attribute access (`x["op"]` is `x.op`): the result
    types replaced dicts, and code written against those keeps working. `"k" in x` and
    `x.get("k")` treat a field set to None as absent, like the JSON."""

    __slots__ = ()

    def _has(self, key):
        return isinstance(key, str) and key in _field_names(type(self))

    def __getitem__(self, key):
        if not self._has(key):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key, default=None):
        value = getattr(self, key) if self._has(key) else None
        return default if value is None else value

    def __contains__(self, key):
        return self._has(key) and getattr(self, key) is not None

    def __repr__(self):
        """Only the fields that are set (differ from their default): short in a notebook."""
        shown = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
            if default is dataclasses.MISSING or v != default:
                shown.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


_NAMES: dict = {}


def _field_names(cls):
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


# -- one located divergence --------------------------------------------------------------------

@dataclass(repr=False)
class EventRef(_ByKey):
    """One event of a trace, its strings resolved (what `Trace.event` reads), and the
    dtypes and shapes of its outputs (findings only)."""

    index: int
    op: str = ""
    name_stack: str = ""
    source: str = ""      # the user's file:line (the primary site)
    step: int = 0
    kind: str = ""
    framework: str = ""
    phase: str = ""
    origin: str = ""
    node: str = ""
    call: int = -1
    params: str = ""
    parent: int = -1
    iter: int = -1
    shapes: list = field(default_factory=list)   # [[int]] per output
    dtypes: list = field(default_factory=list)   # [str] per output
    device: str = ""    # the one device the event ran on ("cpu:3"), "" for none
    rank: Optional[int] = None                   # the trace's rank (manifest `distributed`)
    lib_source: str = ""   # the library's file:line the op ran at, "" when in the user's code

    @classmethod
    def from_event(cls, d: dict, shapes=(), dtypes=(), rank=None) -> "EventRef":
        """From `Trace.event(i)`; `rank` is the trace's (`Trace.rank`)."""
        return cls(index=d["index"], op=d["op"], name_stack=d["name_stack"],
                   source=d["source"], step=d["step"], kind=d["kind"],
                   framework=d["framework"], phase=d["phase"], origin=d["origin"],
                   node=d["node"], call=d["call"], params=d["params"], parent=d["parent"],
                   iter=d["iter"], shapes=list(shapes), dtypes=list(dtypes),
                   device=d.get("device", ""), rank=rank, lib_source=d.get("lib_source", ""))


@dataclass(repr=False)
class Metrics(_ByKey):
    """How far apart two values (or the worst of an event's values) are (`compare/values.py`).
    Real floats: `math.inf` where a NaN meets a number or an infinity differs; None where
    not computed (values known only by statistics, `compare/levels.py`)."""

    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    max_ulp: Optional[float] = None
    mismatch_fraction: Optional[float] = None
    beyond_tolerance_fraction: Optional[float] = None
    within_tolerance: Optional[bool] = None
    rtol: Optional[float] = None
    atol: Optional[float] = None
    bitwise_equal: Optional[bool] = None
    dtype_mismatch: Optional[list] = None        # [dtype a, dtype b]
    shape_mismatch: Optional[bool] = None
    compared_by: Optional[str] = None            # "hash" / "stats" (compare/levels.py); None: bytes
    decided: Optional[bool] = None               # stats: beyond tolerance proven
    max_abs_is_lower_bound: Optional[bool] = None
    cast_only: Optional[bool] = None             # other dtype, same value: only a cast
    note: Optional[str] = None                   # stats: why (not) decided
    tolerance_of: Optional[str] = None           # judged by a less precise input dtype
    ulp: Optional[float] = None                  # --ulp
    n: Optional[int] = None                      # elements
    worst_index: Optional[int] = None            # flat index of the largest difference
    worst_a: Any = None                          # the two values there, for the headline
    worst_b: Any = None                          # (float, complex for complex dtypes)
    stats_a: Optional[dict] = None               # the statistics compared (compare/levels.py)
    stats_b: Optional[dict] = None

    @classmethod
    def from_dict(cls, m: Optional[dict]) -> Optional["Metrics"]:
        """From the engine's metrics dict (`compare.compare_arrays`, `Differ`); None for
        None or an empty dict."""
        if not m:
            return None
        names = _field_names(cls)
        return cls(**{k: v for k, v in m.items() if k in names})


@dataclass(repr=False)
class ValueDesc(_ByKey):
    """One recorded value of an event: slot, name, dtype, shape, whether its bytes are
    stored, whether it is uninitialised memory."""

    slot: int
    name: Optional[str]
    dtype: str
    shape: list
    stored: bool
    uninitialized: bool


@dataclass(repr=False)
class ValueComparison(_ByKey):
    """One output value of a finding on both sides (key: slot, or name for optimizer
    snapshots) and its metrics when it could be compared."""

    key: Union[int, str]
    a: Optional[ValueDesc]
    b: Optional[ValueDesc]
    compared: bool
    metrics: Optional[Metrics] = None


@dataclass(repr=False)
class DeviceDiff(_ByKey):
    """One device's copy of a finding's output value (`diff/compare/devices.py`): its device,
    shard index ("0:4,:"; "" = whole value), replica number, and whether it differs."""

    slot: int
    device: str
    shard: str
    replica: int
    differs: bool


@dataclass(repr=False)
class CallRef(_ByKey):
    """The compiled call a finding was found inside (and its probe, `record --probe`)."""

    a: int
    b: int
    op: str
    probe_a: Optional[int] = None
    probe_b: Optional[int] = None


@dataclass(repr=False)
class ArgDiff(_ByKey):
    """One non-tensor argument whose recorded value differs between the paired ops
    (`diff/compare/args.py`): its name and the two values as recorded (None: not on that side)."""

    name: str
    a: Optional[str]
    b: Optional[str]


@dataclass(repr=False)
class Finding(_ByKey):
    """One located divergence: the paired events, how their outputs differ, and whether
    the event introduced the difference (its inputs match) or inherited it."""

    level: str                                   # "bitwise" or "tolerance"
    a: EventRef
    b: EventRef
    metrics: Optional[Metrics] = None            # worst over the event's differing values
    values: list = field(default_factory=list)   # [ValueComparison] per output value
    inputs_match: Optional[bool] = None          # True / False / None (unknown), at `level`
    inputs_reason: str = ""
    # every input bitwise equal (True), one differs bitwise (False), unknown (None): only
    # True makes the event the op that introduced the difference
    inputs_bitwise: Optional[bool] = None
    # inputs within tolerance but not bitwise: [a, b], each side's max rel error from the
    # float64 replay of the op on its own inputs (what the op adds), when replayed
    local_error: Optional[list] = None

    @property
    def introduced(self) -> bool:
        """The event introduced the difference: its inputs match and none differs bitwise
        (an op whose inputs differ within tolerance may add to a difference, or carry it)."""
        return self.inputs_match is True and self.inputs_bitwise is not False
    origin: str = ""                             # compiled / replay / eager / snapshot / ...
    note: str = ""
    call: Optional[CallRef] = None               # enclosing compiled call when descended into
    pair_by: str = "structure"
    # a compiled call found at the call itself: "replay matches" (every replayed equation
    # matches, no probe recorded), "probe does not reproduce" (its probe matches too)
    compiled: str = ""
    # cross-framework: the layer on both sides ({a, b, text, family, a_module, b_module,
    # a_source, b_source}: "Dense MLP/fc1 (dot_general + add) <-> Linear fc1 (addmm)")
    layer: dict = None
    # per-device copies of the outputs ([DeviceDiff]) and where they differ, in one line
    # ("differs on cpu:3 only (shard 4 of 8)"); empty unless recorded per device
    devices: list = field(default_factory=list)
    device_note: str = ""
    # an optimizer-internal op: its optimizer, state and leaf (optroles.op_label), e.g.
    # "torch Adam: exp_avg of fc1.weight"
    optimizer: Optional[str] = None
    # the op's non-tensor arguments that differ ([ArgDiff]: "start 8 vs 9"), diff/compare/args.py
    arguments: list = field(default_factory=list)
    # the paired outputs differ in dtype: the dtypes (a vs b) and why, put first
    # ("float32 vs bfloat16: autocast on b (cpu bfloat16)"; diff/compare/dtypes.py)
    dtype_note: str = ""


@dataclass(repr=False)
class Structural(_ByKey):
    """An op one run executed and the other did not, which changed what the run computed
    after it (`diff/align/structure.py`): the event, the paired events it feeds whose inputs
    differ, where it sits in trace a's order, and the run of unpaired events around it."""

    side: str                                    # "a" or "b": the run that has the op
    event: EventRef
    consumers: list = field(default_factory=list)   # [EventRef] of that run
    position: float = 0.0                        # in trace a's order (x.5: between events)
    gap: dict = field(default_factory=dict)      # {side, start, length}
    text: str = ""                               # "only in b: aten::mul.Tensor at f.py:9, rank 2"
    first: bool = False                          # before the first value difference


# -- the chain from the origin to the outputs (explain/chain.py) -----------------------------------------

@dataclass(repr=False)
class Hop(_ByKey):
    """One event on the dataflow path from the origin: its outputs' worst relative
    difference, its inputs', and their ratio (amplification: >1 magnified)."""

    a: EventRef          # index, op, name_stack, source, step, kind, framework, origin, phase
    b: int               # the paired event of b
    metrics: Metrics     # max_rel, max_abs, max_ulp, within_tolerance
    input_rel: Optional[float] = None
    amplification: Optional[float] = None
    role: str = ""       # "origin", "first_beyond_tolerance", "last", comma-separated


@dataclass(repr=False)
class Gap(_ByKey):
    """Hops left out of a collapsed chain (`chain.collapse`), counted."""

    hops: int

    def __str__(self):
        return f"... {self.hops} more hops"


@dataclass(repr=False)
class Strongest(_ByKey):
    """The hop that amplified the difference most."""

    index: int
    op: str
    amplification: float
    input_rel: Optional[float]
    output_rel: Optional[float]


@dataclass(repr=False)
class Chain(_ByKey):
    """The path origin -> first beyond tolerance -> last differing event (`chain.build`):
    every hop (up to chain.MAX_LINKS, then the last) and what it shows."""

    hops: list = field(default_factory=list)     # [Hop]
    reaches_target: Optional[bool] = None        # None: no target (nothing beyond tolerance)
    hops_total: int = 0
    last: Optional[int] = None
    strongest: Optional[Strongest] = None
    error: Optional[str] = None                  # the chain could not be built


# -- the replay verdict -----------------------------------------------------------------------

@dataclass(repr=False)
class Mechanism(_ByKey):
    """One candidate numeric mechanism re-executed on a side's recorded inputs
    (diff/explain/mechanisms/): does it reproduce that side's recorded output bitwise, and if
    not, how far is it (max ULP in the output dtype)."""

    side: str                  # "a" or "b"
    name: str                  # hypothesis: fma, reciprocal_multiply, tf32_inputs, ...
    bitwise: bool
    max_ulp: float
    note: str


@dataclass(repr=False)
class Replay(_ByKey):
    """locate's short replay verdict of the origin (`analysis.short`): the op re-executed
    here from each side's recorded inputs; which side is closer to the exact result;
    what this machine reproduces. Only `verdict` is set when no explanation could be made."""

    verdict: str
    event: Optional[str] = None                  # "op (a #i)"
    event_index: Optional[int] = None
    event_index_b: Optional[int] = None
    replayable: Optional[bool] = None
    summary: Optional[str] = None
    a_ulp_from_exact: Optional[float] = None
    b_ulp_from_exact: Optional[float] = None
    exact_by: Optional[str] = None               # "float64", "numpy long double"
    reproduced_here: Optional[str] = None        # "a", "b", "both", "neither"
    likely_cause: Optional[str] = None
    compiled_call: Optional[str] = None
    mechanism: Optional[str] = None              # one line: which numerics reproduce each side
    mechanisms: list = field(default_factory=list)   # [Mechanism]


@dataclass(repr=False)
class FromOracle(_ByKey):
    """How far one side's recorded output is from the high-precision result."""

    max_ulp: float
    max_ulp_exact: Optional[float]
    mean_ulp_exact: Optional[float]
    max_rel: float
    sum_abs: float


@dataclass(repr=False)
class SideReplay(_ByKey):
    """The origin op of one side, replayed here."""

    op: str
    replayed: bool
    reproduced_here: Optional[bool] = None
    reason: Optional[str] = None
    returned_zero: Optional[bool] = None         # the side returned 0 where exact is not
    from_oracle: Optional[FromOracle] = None


@dataclass(repr=False)
class Oracle(_ByKey):
    """The high-precision reference: how it was computed, from which side's inputs."""

    computed_by: str
    side: str
    op: str                                      # the op, or a fused expression's text
    expression: Optional[bool] = None            # the exact value of a fused expression


@dataclass(repr=False)
class ReplayRun(_ByKey):
    """The full replay of the origin (`verdict.replay_verdict`, explain's "replay")."""

    a_index: int
    b_index: int
    op: str
    op_b: str
    verdict: str
    replayed: bool = False
    reason: Optional[str] = None                 # why it was not replayed
    a: Optional[SideReplay] = None
    b: Optional[SideReplay] = None
    oracle: Optional[Oracle] = None
    oracle_note: Optional[str] = None
    closer: Optional[str] = None                 # "a", "b", "equal"
    closer_by: Optional[str] = None              # the metric that decided (verdict.CLOSER_BY)
    reproduces: Optional[str] = None             # "a", "b", "both", "neither"
    machine: Optional[dict] = None               # what this machine replays with
    mechanism: Optional[str] = None              # one line (mechanisms/summary.py)
    mechanisms: list = field(default_factory=list)   # [Mechanism] (diff/explain/mechanisms/)
    # why no float64 verdict: the op rounds nothing (diff/compare/args.py), and what differs instead
    not_judged: Optional[str] = None


# -- the rest of `tracediff explain` -----------------------------------------------------------

@dataclass(repr=False)
class Cause(_ByKey):
    """A recorded environment difference that can change the origin's kind of op."""

    key: str
    a: Any
    b: Any
    reason: str
    rank: int
    note: Optional[str] = None
    device: Optional[bool] = None   # the accelerator's numerics (backend, device kind, precision)


@dataclass(repr=False)
class Causes(_ByKey):
    """The ranked likely causes (`causes.environment`), drawn only from the manifests."""

    op_class: str
    causes: list = field(default_factory=list)   # [Cause], most likely first
    none_found: Optional[str] = None


@dataclass(repr=False)
class Inner(_ByKey):
    """How the equations inside a (nested) jit origin pair up between the runs."""

    equations_a: int
    equations_b: int
    only_in_a: int
    only_in_b: int
    differing: int
    text: str


@dataclass(repr=False)
class CompiledCall(_ByKey):
    """A divergence inside a compiled call that no single replayed equation explains."""

    call: str
    event: int
    explanation: str
    narrow: str
    probe: Optional[int] = None                  # the probe that narrowed it
    narrowed_op: Optional[str] = None
    narrowed_event: Optional[int] = None


@dataclass(repr=False)
class OptimizerStep(_ByKey):
    """One compared optimizer step. `worst` is the parameter with the largest relative L2
    of its own (||a-b|| / ||a|| of that tensor: max rel is set by near-zero elements and
    names the wrong tensor); `max_rel`/`max_abs` are the largest over all parameters."""

    step: int
    a: int
    b: int
    bitwise_equal: bool
    max_rel: float
    max_abs: float
    worst: Optional[str]
    compared: Optional[int] = None    # two frameworks: values compared by role
    by: Optional[str] = None          # two frameworks: "role" (align/optroles.py)
    rel_l2: Optional[float] = None    # ||a - b|| / ||a|| over every parameter compared
    worst_rel_l2: Optional[float] = None   # ||a - b|| / ||a|| of the `worst` tensor alone
    worst_max_abs: Optional[float] = None  # max |a - b| of the `worst` tensor
    beyond: Optional[int] = None      # two frameworks: values beyond tolerance (by role)
    first_beyond: Optional["ParamDivergence"] = None   # the first of them (optroles.ROLE_ORDER)
    # two frameworks: parameters that differ after the step where their grads are rounding
    # noise (pairing/roles.py `_noise_steps`): undetermined, not judged beyond tolerance
    undetermined: Optional[list] = None
    # two frameworks: parameters whose grads are beyond tolerance in a step entered with
    # undetermined parameters: computed from what those left to each side's noise, not judged
    # (a port's backward bug differs at the first step already, where none is undetermined)
    shifted: Optional[list] = None
    # --level stats/calls: a differing parameter known only by hash and statistics; max_abs
    # is then what the statistics prove (a lower bound), rel_l2 and max_rel are unknown (None)
    max_abs_is_lower_bound: Optional[bool] = None


@dataclass(repr=False)
class ParamDivergence(_ByKey):
    """The first parameter whose gradient, optimizer state or value after the step differs
    beyond tolerance between two frameworks (roles in the order a step computes them,
    parameters in the model's order), judged per tensor: ||a - b|| > rtol * ||a|| + atol *
    sqrt(n), b laid out like a by role (a Flax kernel against the torch weight transposed).
    `weight_decay`: the difference is `decay` times the parameter before the step, the
    signature of decoupled weight decay applied on one side only (a decay mask)."""

    step: int
    parameter: str               # as the user names it: torch's name when one side is torch
    role: str                    # "grads", "exp_avg", "exp_avg_sq", "params" (after the step)
    a: str                       # the snapshot values compared
    b: str
    a_event: int
    b_event: int
    rel_l2: float                # ||a - b|| / ||a|| of this tensor
    max_abs: float
    rtol: float
    atol: float
    upstream_match: Optional[bool] = None   # grads (and state) of this parameter within tolerance
    weight_decay: Optional[bool] = None     # the difference is decay * parameter before the step
    decay: Optional[float] = None           # (a - b) / parameter: lr * wd that a lacks (>0)
    decay_parameters: list = field(default_factory=list)   # every parameter with that signature
    note: str = ""
    # the optimizer settings of this parameter that differ between the sides, where both
    # recorded them (the `optim_settings` table): [{"setting": "b2", "a": "0.95", "b": "0.999"}]
    settings: list = field(default_factory=list)
    settings_recorded: Optional[bool] = None   # both sides recorded settings to compare


@dataclass(repr=False)
class Loss(_ByKey):
    """The loss of a step on both sides, only where the trace says which value it is
    (`steps.loss_events`: passed to backward(), or the differentiated function's value)."""

    a: float
    b: float
    rel: float
    event: int
    op: str
    source: str
    how: Optional[str] = None        # why this value is the loss (steps.LOSS_TORCH/LOSS_JAX)


@dataclass(repr=False)
class StepRow(_ByKey):
    """One row of explain's divergence over time: parameters and loss of a step."""

    step: int
    optimizer: Optional[OptimizerStep] = None
    loss: Optional[Loss] = None


@dataclass(repr=False)
class Noise(_ByKey):
    """The noise floor (`--noise`): events nondeterministic on a's machine."""

    nondeterministic_events: int
    skipped: list                                 # [{"index", "op"}], the first 20
    skipped_total: int
    note: str


@dataclass(repr=False)
class TraceInfo(_ByKey):
    """One compared trace file."""

    path: str
    complete: bool
    events: int
    script: Optional[str]
    hostname: Any
    created: Any
    framework: Optional[str] = None    # a side of a cross-framework comparison: jax / torch


@dataclass(repr=False)
class Source(_ByKey):
    """One source of the difference (`explain/sources.py`): where a difference enters,
    grouped by mechanism and side over events and steps, with its estimated share of the
    whole, its fix and the counterfactual run that checks it."""

    rank: int
    share: float                  # estimated fraction of the difference (0..1)
    weight: float                 # sum over its events of ||added|| / ||output|| (L2)
    mechanism: str                # initialiser, bf16_inputs, fma, implementation:<class>, ...
    mechanism_text: str
    side: str                     # "a" / "b": the side that computes differently; "both":
                                  # introduced on bitwise-equal inputs
    how: str                      # "introduced" (inputs bitwise equal) or "adds" (beyond
                                  # what its inputs carry)
    ops: list                     # [[op, events]]
    modules: list                 # module path patterns (digits as *)
    steps: list                   # [first, last]
    events: int                   # events of trace a in this source
    replayed: int                 # of them, re-run here to measure local errors
    local_a: Optional[float] = None   # worst local error, relative L2, a / b
    local_b: Optional[float] = None
    added: Optional[float] = None     # worst relative difference added at one event
    event_a: int = -1             # its largest event, a and b
    event_b: int = -1
    first_event: int = -1
    fix: str = ""
    counterfactual: list = field(default_factory=list)   # command / comment lines
    causes: list = field(default_factory=list)           # environment keys, ranked
    text: str = ""                # one line for the terminal


@dataclass(repr=False)
class Sources(_ByKey):
    """Every source of the difference, ranked by estimated share (`explain/sources.py`)."""

    sources: list = field(default_factory=list)   # [Source], largest share first
    examined: int = 0             # paired computing events whose outputs differ
    replayed: int = 0             # op runs spent measuring local errors
    bound: bool = False           # stats-level: introduced sources only, shares are bounds
    # [[op, events, reason]]: differing ops whose local error could not be measured here
    # (not replayable): the shares are of the measured sources only
    not_judged: list = field(default_factory=list)
    estimator: str = ("share = the relative difference each source adds where it acts "
                      "(||added|| / ||output||, L2), summed over its events (the initialiser: "
                      "its initial values as a whole), over the total")
    note: str = ""


@dataclass
class Analysis:
    """What `tracediff explain` computes (`analysis.analyse`): the origin and the chain
    from it, its replay, the compiled-call and inner-structure notes, the likely causes,
    the divergence over time, and a one-paragraph summary. `origin` is None when the
    traces match bitwise, or differ only in structure (`structural`: nothing to replay)."""

    verdict: str
    traces: dict                                  # {"a": TraceInfo, "b": TraceInfo}
    tolerance: dict
    origin: Optional[Finding] = None
    summary: str = ""
    steps: list = field(default_factory=list)     # [StepRow]
    chain: Optional[Chain] = None
    replay: Optional[ReplayRun] = None
    compiled_call: Optional[CompiledCall] = None
    inner: Optional[Inner] = None
    environment: Optional[Causes] = None
    tolerance_origin: Optional[Finding] = None    # first beyond tolerance, introduced there
    noise: Optional[Noise] = None
    mechanisms: list = field(default_factory=list)   # [Mechanism] of the origin's replay
    structural: Optional[Structural] = None       # an op only one run has, the first difference
    # the origin is `structural`, an in-place write only one run executed (`p.to_local().mul_`):
    # the script's own op changed the values; `origin` is then None (nothing to replay)
    origin_write: bool = False
    sources: Optional[Sources] = None             # every source, ranked (explain/sources.py)
    coverage: Any = None                          # locate's Coverage: explain's verdict is locate's


# -- recording levels (compare/levels.py) ------------------------------------------------------------

@dataclass(repr=False)
class LevelSide(_ByKey):
    """How one side was recorded (manifest "recording")."""

    level: str
    steps: Any = None
    ops: Any = None
    modules: Any = None
    max_bytes: Any = None
    values_capped_at_event: Any = None


@dataclass(repr=False)
class ZoomSide(_ByKey):
    """The `record` command that zooms in on one machine."""

    trace: str
    command: str
    notes: list                                   # comment lines before the command
    on: Any                                       # the machine's hostname


@dataclass(repr=False)
class Zoom(_ByKey):
    """The two `record` commands (one per machine) and the `locate` that follows."""

    a: ZoomSide
    b: ZoomSide
    then: str
    step: int
    title: str


@dataclass(repr=False)
class Levels(_ByKey):
    """What each side was recorded with, what was decided without the bytes, and the
    commands that zoom in at full level (the two-level search)."""

    a: LevelSide
    b: LevelSide
    compared_without_bytes: dict                  # hash_equal, stats_beyond/undecided counts
    decided: list = field(default_factory=list)
    not_decided: list = field(default_factory=list)
    zoom: list = field(default_factory=list)      # [Zoom]


# -- coverage: what a comparison compared (diff/coverage.py) -------------------------------------

@dataclass(repr=False)
class CoverageSide(_ByKey):
    """One side of a comparison: its computing events (units for two frameworks or eager
    against torch.compile) recorded, paired with the other side and compared (both held
    bytes or a hash), per phase; its output values and bytes; what stopped its capture."""

    side: str                                    # "a" or "b"
    path: str
    framework: str = ""                          # "jax", "torch", "jax+torch"
    counted: str = "events"                      # "events" or "computing units"
    events: int = 0
    # paired with the other side; two frameworks: or inside a module paired at its output
    paired: int = 0
    compared: int = 0                            # paired, and both sides hold bytes or a hash
    setup: int = 0                               # units not counted: not the other side's work
    values: int = 0                              # output values of the counted events
    values_with_data: int = 0                    # ... whose bytes or exact-bytes hash were recorded
    bytes: int = 0                               # bytes stored for them
    by_phase: dict = field(default_factory=dict)  # {"forward": {events, paired, compared}, ...}
    rank: Optional[int] = None
    capture: list = field(default_factory=list)  # [str]: what stopped or lost the capture


@dataclass(repr=False)
class UnpairedRegion(_ByKey):
    """A run of consecutive unpaired events (units) of one side: where it starts, how long
    it is, its first op, module and line."""

    side: str
    start: int
    length: int
    op: str = ""
    module: str = ""
    source: str = ""


@dataclass(repr=False)
class Coverage(_ByKey):
    """What a comparison compared (`diff/coverage.py`): each side's counts, whether that is
    enough for a MATCH (`bar` of each side's computing events paired and compared, no
    capture stopped), the reasons when not, the largest unpaired regions and the next step."""

    a: CoverageSide
    b: CoverageSide
    bar: float
    sufficient: bool
    reasons: list = field(default_factory=list)   # [str]
    unpaired: list = field(default_factory=list)  # [UnpairedRegion], largest first
    next_step: str = ""


# -- the result of locate --------------------------------------------------------------------

# 0 match, 1 diverged, 2 error (the CLI's), 3 inconclusive: a match on too little evidence
EXIT_CODES = {"match": 0, "diverged": 1, "inconclusive": 3}


@dataclass
class LocateResult:
    """Two traces compared: the verdict, the findings, and what explains them."""

    path_a: str
    path_b: str
    verdict: str                                  # "match", "diverged" or "inconclusive"
    first_difference: Optional[Finding] = None
    first_beyond_tolerance: Optional[Finding] = None
    replay_only: Optional[Finding] = None
    # the first event beyond tolerance by relative error alone that is rounding noise
    # around zero (diff/compare/nearzero.py): not counted, shown apart; how many events were
    near_zero: Optional[Finding] = None
    near_zero_total: int = 0
    alignment: dict = field(default_factory=dict)  # align.Alignment.stats()
    gaps: list = field(default_factory=list)
    env_diff: list = field(default_factory=list)   # [{key, category, a, b, ...}] (explain/env.py)
    optimizer_steps: list = field(default_factory=list)   # [OptimizerStep]
    warnings: list = field(default_factory=list)
    traces: dict = field(default_factory=dict)     # {"a": TraceInfo, "b": TraceInfo}
    tolerance: dict = field(default_factory=dict)
    mapping: list = field(default_factory=list)
    optimizer_steps_total: int = 0
    explain: Optional[Replay] = None               # short replay verdict of the origin
    chain: Optional[list] = None                   # [Hop | Gap]: origin -> outputs, collapsed
    noise: Optional[Noise] = None
    levels: Optional[Levels] = None
    first_parameter: Optional[ParamDivergence] = None   # two frameworks: optimizer by role
    structural: Optional[Structural] = None        # an op only one run has (align/structure.py)
    coverage: Optional[Coverage] = None            # what was compared (diff/coverage.py)
    sources: Optional[Sources] = None              # every source, ranked (explain/sources.py)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.verdict, 0)


# -- many ranks: `tracediff locate DIR_A DIR_B` (diff/distributed/ranks.py) ---------------------------------

@dataclass(repr=False)
class RankSummary(_ByKey):
    """One rank's pair of traces located: where its first divergence beyond tolerance is
    (None fields when the pair matches), and where that sits along the collectives."""

    rank: int
    path_a: str
    path_b: str
    verdict: str                          # "match" / "diverged"
    index: Optional[int] = None           # the event of trace a
    op: str = ""
    source: str = ""
    name_stack: str = ""
    step: Optional[int] = None
    device: str = ""                      # the event's device, when the trace records one
    inputs_match: Optional[bool] = None
    collective: Optional[int] = None      # collectives (c10d::*) before the event in trace a
    at_collective: bool = False           # the event is itself a collective
    structural: str = ""                  # its first difference is an op only one run has
    collective_op: str = ""               # at a collective: the exchange itself (the op a
                                          # functional collective's wait_tensor waited for)
    param: str = ""                       # the DTensor parameter whose local shard it is
    shard: str = ""                       # where that shard sits: "offset 8,0 of 16,8 (S(0))"


@dataclass(repr=False)
class Spread(_ByKey):
    """How a divergence reached another rank: through which collective (None `via`: the
    rank diverged on its own, a second origin)."""

    rank: int
    step: Optional[int]
    op: str
    via: Optional[str] = None             # the collective op that carried it
    collective: Optional[int] = None      # its ordinal along the rank's collectives
    source: str = ""
    device: str = ""                      # the device of the rank's first divergence, if known


@dataclass
class RanksResult:
    """Per-rank traces of two runs compared rank by rank (`diff/distributed/ranks.py`): the earliest
    divergence across ranks (`result`, the full `LocateResult` of that rank's pair, with
    `first_rank`), every rank's summary, and how the divergence spread."""

    verdict: str                          # "match" / "diverged" / "inconclusive"
    ranks: list                           # [RankSummary], by rank
    result: LocateResult                  # the first rank's (rank 0's when all match)
    first_rank: Optional[int] = None
    spread: list = field(default_factory=list)   # [Spread]
    note: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.verdict, 0)


# -- replicas: `tracediff replicas TRACE_OR_DIR` (diff/distributed/replicas.py) ---------------------------

@dataclass(repr=False)
class ReplicaDeparture(_ByKey):
    """The first replicated value whose copy differs: on which rank / device, at which
    event (of that rank's trace), op, step and source line."""

    rank: Optional[int]
    device: str
    step: int
    op: str
    source: str
    event: int
    name_stack: str = ""
    phase: str = ""


@dataclass
class ReplicasResult:
    """One run's replicas checked (`diff/distributed/replicas.py`): consistent, the first departure
    and who departed, or "nothing_to_compare" (no replicated value to compare; `note` says why)."""

    verdict: str                                  # "consistent" / "diverged" / "nothing_to_compare"
    checked: int                                  # replicated values compared (0: "nothing_to_compare")
    ranks: list                                   # the ranks checked ([] within one trace)
    reference_rank: Optional[int] = None
    first: Optional[ReplicaDeparture] = None
    departed: list = field(default_factory=list)  # ranks whose copies differ at `first`
    devices: list = field(default_factory=list)   # devices whose copies differ at `first`
    note: str = ""

    @property
    def exit_code(self) -> int:
        """0 consistent, 1 diverged, 2 nothing to compare (as an error: never a pass)."""
        return {"diverged": 1, "nothing_to_compare": 2}.get(self.verdict, 0)
