"""What `tracediff confirm` measured (`diff/confirm/`): the runs it made, each with one
setting of the other side (or all but one), how much of the difference each removed, the
cause of each source found by experiment, and where the settings interact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey


@dataclass(repr=False)
class ConfirmRun(_ByKey):
    """One re-run of side b, recorded into `trace`: `reverted` are the settings set as on
    a ("without X"), or every setting but `alone` ("X alone")."""

    name: str                     # "b as recorded", "without X", "X alone", "as a"
    reverted: list                # labels of the settings set as on a
    alone: str = ""               # the one setting left as on b ("X alone" runs)
    substituted: int = 0          # the rank of the source whose outputs were a's values
    command: str = ""             # the command line, exactly as it was run
    trace: str = ""
    exit_code: Optional[int] = None
    seconds: float = 0.0
    distance: Optional[float] = None   # relative L2 of what is measured, against trace a
    removal: Optional[float] = None    # 1 - distance / distance of "b as recorded"
    error: str = ""               # why the run gave no measurement


@dataclass(repr=False)
class SettingEffect(_ByKey):
    """One setting, measured both ways: the part of the difference removed when it alone
    is set as on a, and the part it makes when it alone is set as on b."""

    setting: str                  # "ONEDNN_MAX_CPU_ISA", "XLA flag --xla_cpu_max_isa", ...
    a: Optional[str]
    b: Optional[str]
    removal: Optional[float] = None    # without it (the others as on b)
    alone: Optional[float] = None      # it alone, as a fraction of the whole difference
    interacts: str = ""           # words where the two measures disagree


@dataclass(repr=False)
class SourceCheck(_ByKey):
    """A source of `locate` (`Source`, by rank) checked by the runs: the settings whose
    re-run removed its op's difference (or made it alone), and the measured removal of
    that setting beside the estimate."""

    rank: int
    ops: str                      # "aten::mm x3, aten::addmm"
    mechanism: str
    estimated: Optional[float]    # the part its share says a counterfactual run removes
    causes_estimated: list = field(default_factory=list)   # environment keys, as locate said
    causes_measured: list = field(default_factory=list)    # settings, found by re-running
    measured: Optional[float] = None   # removal of the run without its measured cause(s)
    verdict: str = ""             # "confirmed", "another cause", "no setting reproduces it"


@dataclass(repr=False)
class Confirmation(_ByKey):
    """What `tracediff confirm A B` measured on this machine."""

    trace_a: str
    trace_b: str
    script: str
    measures: str                 # what a distance is of: "the final parameters", ...
    distance: Optional[float]     # of the two traces, as recorded
    settings: list = field(default_factory=list)     # [SettingEffect]
    unsettable: list = field(default_factory=list)   # [[key, why]]
    runs: list = field(default_factory=list)         # [ConfirmRun]
    sources: list = field(default_factory=list)      # [SourceCheck]
    reproduced: Optional[bool] = None   # did "b as recorded" give b's values again
    residual: Optional[float] = None    # what is left with every setting as on a
    notes: list = field(default_factory=list)
    skipped_runs: int = 0         # runs left out by --max-runs
