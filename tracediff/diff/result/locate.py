"""`LocateResult`: what `tracediff.locate()` returns and every renderer takes, with the
exit code of its verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .coverage import Coverage
from .explanation import Replay
from .findings import Finding, Noise, Structural
from .levels import Levels
from .sources import Sources
from .steps import ParamDivergence


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
    # the first difference passed over because it was overwritten before anything read it
    # (engine/search.py `_absorbed`), and how many were
    absorbed: Optional[Finding] = None
    absorbed_total: int = 0
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
    # where each side's NaN or Inf came from ({"a": NonFinite | None, "b": ...}; one trace of
    # two frameworks: the same for both), None when neither holds one (diff/nonfinite/)
    nonfinite: Optional[dict] = None

    @property
    def nonfinite_only(self) -> Optional[str]:
        """"a" or "b": the one side whose run kept non-finite values, None otherwise."""
        nf = self.nonfinite or {}
        a, b = (x if x is not None and x.kept else None for x in (nf.get("a"), nf.get("b")))
        if (a is None) == (b is None) or self.path_a == self.path_b:
            return None
        return "a" if a is not None else "b"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.verdict, 0)
