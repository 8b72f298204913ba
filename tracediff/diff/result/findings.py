"""One located divergence (`Finding`): its two events (`EventRef`), how their outputs
differ (`Metrics`, `ValueComparison`, per device `DeviceDiff`), the enclosing compiled call
(`CallRef`), the arguments that differ (`ArgDiff`); an op only one run has
(`Structural`); and what every comparison reports next to it: the compared trace files
(`TraceInfo`) and the noise floor (`Noise`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .bykey import _ByKey, _field_names


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


# -- what was compared: the trace files and the noise floor ---------------------------------

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
