"""Recording levels (`compare/levels.py`): how each side was recorded (`LevelSide`), what
was decided without the bytes, and the `record` commands that zoom in (`Zoom`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .bykey import _ByKey


# -- recording levels (compare/levels.py) ------------------------------------------------------------

@dataclass(repr=False)
class LevelSide(_ByKey):
    """How one side was recorded (manifest "recording")."""

    level: str
    steps: Any = None
    ops: Any = None
    modules: Any = None
    max_bytes: Any = None
    values_capped_at_event: Any = None


@dataclass(repr=False)
class ZoomSide(_ByKey):
    """The `record` command that zooms in on one machine."""

    trace: str
    command: str
    notes: list                                   # comment lines before the command
    on: Any                                       # the machine's hostname


@dataclass(repr=False)
class Zoom(_ByKey):
    """The two `record` commands (one per machine) and the `locate` that follows."""

    a: ZoomSide
    b: ZoomSide
    then: str
    step: int
    title: str


@dataclass(repr=False)
class Levels(_ByKey):
    """What each side was recorded with, what was decided without the bytes, and the
    commands that zoom in at full level (the two-level search)."""

    a: LevelSide
    b: LevelSide
    compared_without_bytes: dict                  # hash_equal, stats_beyond/undecided counts
    decided: list = field(default_factory=list)
    not_decided: list = field(default_factory=list)
    zoom: list = field(default_factory=list)      # [Zoom]
