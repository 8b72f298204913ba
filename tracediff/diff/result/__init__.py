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

A package by what the types describe: `findings.py` (one located divergence and what each
comparison reports next to it), `explanation.py` (`tracediff explain`), `steps.py` (step
by step), `sources.py`, `levels.py`, `coverage.py`, `locate.py` (`LocateResult`),
`distributed.py` (ranks and replicas), `nonfinite.py` (where a NaN or Inf came from),
`confirmation.py` (`tracediff confirm`); `bykey.py` gives every type read access by key.
This module is the package's public face: every type is imported from here
(`from tracediff.diff.result import Finding`).
"""

from .findings import (EventRef, Metrics, ValueDesc, ValueComparison, DeviceDiff, CallRef, ArgDiff,
                       Finding, Structural, Noise, TraceInfo)
from .explanation import (Hop, Gap, Strongest, Chain, Mechanism, Replay, FromOracle, SideReplay,
                          Oracle, ReplayRun, Cause, Causes, Inner, CompiledCall, Analysis)
from .steps import OptimizerStep, ParamDivergence, Loss, StepRow
from .sources import Source, Sources
from .levels import LevelSide, ZoomSide, Zoom, Levels
from .coverage import CoverageSide, UnpairedRegion, Coverage
from .locate import EXIT_CODES, LocateResult
from .distributed import RankSummary, Spread, RanksResult, ReplicaDeparture, ReplicasResult
from .nonfinite import NonFiniteValue, NonFiniteStep, NonFinite, NonFiniteRanks
from .confirmation import ConfirmRun, SettingEffect, SourceCheck, Confirmation

__all__ = ["EventRef", "Metrics", "ValueDesc", "ValueComparison", "DeviceDiff", "CallRef",
           "ArgDiff", "Finding", "Structural", "Noise", "TraceInfo", "Hop", "Gap", "Strongest",
           "Chain", "Mechanism", "Replay", "FromOracle", "SideReplay", "Oracle", "ReplayRun",
           "Cause", "Causes", "Inner", "CompiledCall", "Analysis", "OptimizerStep",
           "ParamDivergence", "Loss", "StepRow", "Source", "Sources", "LevelSide", "ZoomSide",
           "Zoom", "Levels", "CoverageSide", "UnpairedRegion", "Coverage", "EXIT_CODES",
           "LocateResult", "RankSummary", "Spread", "RanksResult", "ReplicaDeparture",
           "ReplicasResult", "NonFiniteValue", "NonFiniteStep", "NonFinite", "NonFiniteRanks",
           "ConfirmRun", "SettingEffect", "SourceCheck", "Confirmation"]
