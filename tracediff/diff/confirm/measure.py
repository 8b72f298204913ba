"""What a counterfactual run is judged by: how far its result is from trace a (the final
parameters after the last optimizer step, as the sources' shares are; a program without an
optimizer: its last output), and, at each source's op, whether the run removed that op's
difference (its outputs equal a's) or makes it on its own (its inputs equal a's, its
outputs not)."""

from __future__ import annotations

import numpy as np

from ...trace import schema
from ..compare import values as _values
from ..differ import Differ, comparable
from ..explain.source_kinds import dtype_change

REMOVED, MAKES, UNKNOWN = "removed", "makes", "unknown"


def measured_what(d: Differ) -> str:
    return ("the final parameters (after the last optimizer step)" if d._optimizer_pairs()
            else "the last output both runs compute")


def distance(d: Differ):
    """Relative L2 between a and the run: of the parameters after the last paired
    optimizer step, else of the last paired event's outputs with bytes; None when nothing
    comparable was recorded."""
    steps = d.optimizer_steps()
    if steps:
        last = steps[-1]
        return 0.0 if last.bitwise_equal else last.rel_l2
    ia, ib = d.pairs()
    for ea, eb in zip(ia[::-1].tolist(), ib[::-1].tolist()):
        sums = _sums(d, _out_pairs(d, ea, eb))
        if sums is None:
            continue
        num, den = sums
        return 0.0 if num == 0 else (float(np.sqrt(num / den)) if den > 0 else float("inf"))
    return None


def _out_pairs(d, ea, eb):
    """[(row a, row b)] of two paired events' outputs, by slot ([] when their counts differ)."""
    ra, rb = d.ta.value_rows(ea, schema.ROLE_OUT), d.tb.value_rows(eb, schema.ROLE_OUT)
    if len(ra) != len(rb):
        return []
    return list(zip(ra[np.argsort(ra["slot"], kind="stable")],
                    rb[np.argsort(rb["slot"], kind="stable")]))


def _sums(d, pairs):
    """(||a - b||^2, ||a||^2) over paired value rows; None where there are none, or one is
    not stored or not of the other's shape."""
    if not pairs:
        return None
    num = den = 0.0
    for ra, rb in pairs:
        if ra is None or rb is None or not (comparable(ra) and comparable(rb)):
            return None
        x, y = np.asarray(d.ra.read(ra), np.float64), np.asarray(d.rb.read(rb), np.float64)
        if x.shape != y.shape:
            return None
        num, den = num + float(np.sum((x - y) ** 2)), den + float(np.sum(x ** 2))
    return num, den


def _rel_rows(d, pairs):
    """Relative L2 over paired value rows; None where `_sums` has none or ||a|| is 0."""
    sums = _sums(d, pairs)
    return float(np.sqrt(sums[0] / sums[1])) if sums is not None and sums[1] > 0 else None


def op_difference(d: Differ, ea: int):
    """(outputs, inputs): relative L2 between a's outputs of event `ea` and the run's
    paired event's (0 when bitwise equal), and the same of their dataflow inputs; None
    where not paired or not stored on both sides."""
    eb = int(d.al.a2b[ea]) if 0 <= ea < len(d.al.a2b) else -1
    if eb < 0:
        return None, None
    inputs = _rel_rows(d, [(x, y) for _, x, y in d.input_pairs(ea, eb)])
    if d.sa.content[ea] == d.sb.content[eb]:
        return 0.0, inputs
    return _rel_rows(d, _out_pairs(d, ea, eb)), inputs


def at_op(d: Differ, ea: int) -> str:
    """What the run did at a's event `ea`: REMOVED (its outputs equal a's), MAKES (its
    inputs equal a's and its outputs differ, or it computes in another dtype than a: the
    run's settings make this op differ), or
    UNKNOWN (its inputs differ too, or it is not paired)."""
    eb = int(d.al.a2b[ea]) if 0 <= ea < len(d.al.a2b) else -1
    if eb < 0:
        return UNKNOWN
    if d.sa.content[ea] == d.sb.content[eb]:
        return REMOVED
    if dtype_change(d, ea, eb)[0]:   # computed in another dtype here: this run's making
        return MAKES
    same_inputs = d.inputs_match(ea, eb, _values.BITWISE)[0]
    return MAKES if same_inputs is True else UNKNOWN


__all__ = ["distance", "at_op", "op_difference", "measured_what", "REMOVED", "MAKES", "UNKNOWN"]
