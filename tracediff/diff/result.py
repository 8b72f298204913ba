"""The result of comparing two traces: typed objects that every renderer takes.

`LocateResult` is what `tracediff.locate()` returns and what the terminal, Markdown, HTML
and JSON renderers (in `report/`) render; `Finding` is one located divergence in it.
JSON is made only at the edge (`report.json_report.build`, `tracediff.to_json`).
"""

import dataclasses


@dataclasses.dataclass
class Finding:
    """One located divergence (a plain container; reports render it)."""

    level: str                 # "bitwise" or "tolerance"
    a: dict                    # event of trace a (index, op, name_stack, source, step, ...)
    b: dict
    metrics: dict              # worst over the event's differing values
    values: list               # per compared output value
    inputs_match: object       # True / False / None
    inputs_reason: str
    origin: str                # compiled / replay / eager / snapshot / ...
    note: str = ""
    call: dict = None          # enclosing compiled call {a, b, op} when descended into
    pair_by: str = "structure"
    # a compiled call found at the call itself: "replay matches" (every replayed equation
    # matches, no probe recorded), "probe does not reproduce" (its probe matches too)
    compiled: str = ""


@dataclasses.dataclass
class Mechanism:
    """One candidate numeric mechanism re-executed on a side's recorded inputs
    (diff/mechanisms.py): does it reproduce that side's recorded output bitwise, and if
    not, how far is it (max ULP in the output dtype)."""

    side: str                  # "a" or "b"
    name: str                  # hypothesis: fma, reciprocal_multiply, tf32_inputs, ...
    bitwise: bool
    max_ulp: float
    note: str


@dataclasses.dataclass
class LocateResult:
    path_a: str
    path_b: str
    verdict: str
    first_difference: Finding
    first_beyond_tolerance: Finding
    replay_only: Finding
    alignment: dict
    gaps: list
    env_diff: list
    optimizer_steps: list
    warnings: list
    traces: dict
    tolerance: dict
    mapping: list = dataclasses.field(default_factory=list)
    optimizer_steps_total: int = 0
    explain: dict = None       # short replay verdict of the origin (explain.py), or None
    chain: list = None         # origin -> first beyond tolerance -> outputs (chain.py)
    noise: dict = None         # noise floor (--noise): nondeterministic events skipped
    levels: dict = None        # how each side was recorded, what was decided, zoom (levels.py)

    @property
    def exit_code(self):
        return 1 if self.verdict == "diverged" else 0

