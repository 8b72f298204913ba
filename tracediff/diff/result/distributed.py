"""Many traces of one run: `tracediff locate DIR_A DIR_B` rank by rank (`RanksResult`,
a `RankSummary` per rank, how the divergence spread: `Spread`) and `tracediff replicas`
(`ReplicasResult`, the first `ReplicaDeparture`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey
from .locate import EXIT_CODES, LocateResult


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
