"""What `tracediff explain` computes (`Analysis`): the chain from the origin to the outputs
(`Hop`, `Gap`, `Chain`), the replay verdict of the origin (`ReplayRun`, locate's short
`Replay`, each side's `SideReplay`, the `Oracle`, the `Mechanism`s that reproduce a side),
the likely causes (`Cause`), the inner structure of a jit origin (`Inner`) and a compiled
call no single equation explains (`CompiledCall`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .bykey import _ByKey
from .findings import EventRef, Finding, Metrics, Noise, Structural
from .sources import Sources


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
