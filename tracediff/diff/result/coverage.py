"""What a comparison compared (`diff/coverage.py`): each side's counts (`CoverageSide`),
the largest unpaired regions, and whether that is enough for a MATCH (`Coverage`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey


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
