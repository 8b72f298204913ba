"""Where a trace's first NaN or Inf came from (`NonFinite`, `tracediff info`), and across
the traces of one multi-rank run (`NonFiniteRanks`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey
from .findings import EventRef


@dataclass(repr=False)
class NonFiniteValue(_ByKey):
    """One value an op read (or made) around a non-finite value: where it came from and
    what the trace knows of its numbers (bytes, or the statistics of `--level stats`)."""

    slot: int
    role: str                      # "input" / "output"
    source: str = ""               # the producing op, "literal", "outside the recording"
    event: int = -1                # the producing event (-1: none recorded)
    dtype: str = ""
    shape: list = field(default_factory=list)
    nan: Optional[int] = None      # None: not known (neither bytes nor statistics)
    inf: Optional[int] = None
    min: Optional[float] = None    # over the non-NaN elements
    max: Optional[float] = None
    zeros: Optional[int] = None    # exact where the bytes were stored
    element: Optional[float] = None   # the value at the first non-finite output element

    @property
    def finite(self) -> Optional[bool]:
        return None if self.nan is None else (self.nan == 0 and self.inf == 0)


@dataclass(repr=False)
class NonFiniteStep(_ByKey):
    """One event on the way from the origin to where NaN first appears."""

    event: EventRef
    made: str                      # "NaN", "Inf", "NaN and Inf"


@dataclass(repr=False)
class NonFinite(_ByKey):
    """The origin of a trace's non-finite values: the first op that made NaN or Inf from
    finite inputs whose values the run kept (they reach an optimizer step, or a value no
    later op reads), in words, with the values that caused it."""

    path: str
    origin: EventRef               # its phase is forward / backward / optimizer
    made: str                      # "NaN", "Inf", "NaN and Inf"
    # False: no non-finite value reaches what the run keeps (a causal mask's -Inf that the
    # softmax absorbs); `origin` is then the first op that made one
    kept: bool = True
    nan: int = 0                   # counts in its outputs
    inf: int = 0
    elements: int = 0
    inputs_finite: Optional[bool] = None   # None: an input's values were not recorded
    received: bool = False         # a collective: another rank's or device's values
    mechanism: str = ""            # "log of a negative number: input min -0.42"
    element: str = ""              # "at [9]: log(-0.4228)" (bytes stored)
    inputs: list = field(default_factory=list)     # [NonFiniteValue]
    nan_at: Optional[EventRef] = None    # where Inf first turned into NaN
    nan_mechanism: str = ""
    chain: list = field(default_factory=list)      # [NonFiniteStep]: origin .. nan_at
    kept_at: Optional[EventRef] = None   # the first event the run kept its values in
    absorbed: int = 0              # earlier roots whose non-finite values were absorbed
    first_absorbed: Optional[EventRef] = None
    level: str = "values"          # "values" (bytes), "statistics", "calls"
    events_nonfinite: int = 0      # events with a non-finite output, in all
    note: str = ""
    zoom: str = ""                 # the command recording the origin's step with every op


@dataclass(repr=False)
class NonFiniteRanks(_ByKey):
    """The non-finite origin of each rank's trace of one run, and the rank it started on:
    the one whose origin is its own op (the others received it through a collective)."""

    ranks: dict = field(default_factory=dict)      # {rank: NonFinite | None}
    first_rank: Optional[int] = None
    paths: dict = field(default_factory=dict)      # {rank: trace path}
    note: str = ""
