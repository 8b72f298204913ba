"""Every source of the difference (`explain/sources.py`): each one (`Source`) where a
difference enters, grouped by mechanism and side, with its share, fix and counterfactual
run; `Sources` ranks them and says what could not be judged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey


@dataclass(repr=False)
class Source(_ByKey):
    """One source of the difference (`explain/sources.py`): where a difference enters,
    grouped by mechanism and side over events and steps, with its estimated share of the
    whole, its fix and the counterfactual run that checks it."""

    rank: int
    share: Optional[float]        # estimated fraction of the difference (0..1); None where
                                  # no share can be given (`Sources.no_shares` says why)
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
    arguments: str = ""          # "other=2.0 vs 3.0": the arguments that differ (mechanism
                                  # "arguments": the program asked for another computation)
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
    # the initialiser's share followed to the final parameters (optax runs with bytes):
    # the other shares are still estimated where their sources act
    initialiser_followed: bool = False
    note: str = ""
    no_shares: str = ""           # why the sources carry no share (listed by first event)
