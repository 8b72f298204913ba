"""The comparison step by step of a training run: each optimizer step (`OptimizerStep`),
the first parameter beyond tolerance between two frameworks (`ParamDivergence`), the loss
(`Loss`), one row of explain's divergence over time (`StepRow`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .bykey import _ByKey


@dataclass(repr=False)
class OptimizerStep(_ByKey):
    """One compared optimizer step. `worst` is the parameter with the largest relative L2
    of its own (||a-b|| / ||a|| of that tensor: max rel is set by near-zero elements and
    names the wrong tensor); `max_rel`/`max_abs` are the largest over all parameters."""

    step: int
    a: int
    b: int
    bitwise_equal: bool
    max_rel: float
    max_abs: float
    worst: Optional[str]
    compared: Optional[int] = None    # two frameworks: values compared by role
    by: Optional[str] = None          # two frameworks: "role" (align/optroles.py)
    rel_l2: Optional[float] = None    # ||a - b|| / ||a|| over every parameter compared
    worst_rel_l2: Optional[float] = None   # ||a - b|| / ||a|| of the `worst` tensor alone
    worst_max_abs: Optional[float] = None  # max |a - b| of the `worst` tensor
    beyond: Optional[int] = None      # two frameworks: values beyond tolerance (by role)
    first_beyond: Optional["ParamDivergence"] = None   # the first of them (optroles.ROLE_ORDER)
    # two frameworks: parameters that differ after the step where their grads are rounding
    # noise (pairing/roles.py `_noise_steps`): undetermined, not judged beyond tolerance
    undetermined: Optional[list] = None
    # two frameworks: parameters whose grads are beyond tolerance in a step entered with
    # undetermined parameters: computed from what those left to each side's noise, not judged
    # (a port's backward bug differs at the first step already, where none is undetermined)
    shifted: Optional[list] = None
    # --level stats/calls: a differing parameter known only by hash and statistics; max_abs
    # is then what the statistics prove (a lower bound), rel_l2 and max_rel are unknown (None)
    max_abs_is_lower_bound: Optional[bool] = None


@dataclass(repr=False)
class ParamDivergence(_ByKey):
    """The first parameter whose gradient, optimizer state or value after the step differs
    beyond tolerance between two frameworks (roles in the order a step computes them,
    parameters in the model's order), judged per tensor: ||a - b|| > rtol * ||a|| + atol *
    sqrt(n), b laid out like a by role (a Flax kernel against the torch weight transposed).
    `weight_decay`: the difference is `decay` times the parameter before the step, the
    signature of decoupled weight decay applied on one side only (a decay mask)."""

    step: int
    parameter: str               # as the user names it: torch's name when one side is torch
    role: str                    # "grads", "exp_avg", "exp_avg_sq", "params" (after the step)
    a: str                       # the snapshot values compared
    b: str
    a_event: int
    b_event: int
    rel_l2: float                # ||a - b|| / ||a|| of this tensor
    max_abs: float
    rtol: float
    atol: float
    upstream_match: Optional[bool] = None   # grads (and state) of this parameter within tolerance
    weight_decay: Optional[bool] = None     # the difference is decay * parameter before the step
    decay: Optional[float] = None           # (a - b) / parameter: lr * wd that a lacks (>0)
    decay_parameters: list = field(default_factory=list)   # every parameter with that signature
    note: str = ""
    # the optimizer settings of this parameter that differ between the sides, where both
    # recorded them (the `optim_settings` table): [{"setting": "b2", "a": "0.95", "b": "0.999"}]
    settings: list = field(default_factory=list)
    settings_recorded: Optional[bool] = None   # both sides recorded settings to compare


@dataclass(repr=False)
class Loss(_ByKey):
    """The loss of a step on both sides, only where the trace says which value it is
    (`steps.loss_events`: passed to backward(), or the differentiated function's value)."""

    a: float
    b: float
    rel: float
    event: int
    op: str
    source: str
    how: Optional[str] = None        # why this value is the loss (steps.LOSS_TORCH/LOSS_JAX)


@dataclass(repr=False)
class StepRow(_ByKey):
    """One row of explain's divergence over time: parameters and loss of a step."""

    step: int
    optimizer: Optional[OptimizerStep] = None
    loss: Optional[Loss] = None
