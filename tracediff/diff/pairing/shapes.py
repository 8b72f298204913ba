"""A finding at two ops that read the same values and return other shapes.

Why: a port whose conv has stride 2 where the original's has 1 reads the same image and
kernel and returns [2, 8, 3, 3] against [2, 6, 6, 8]. The pairing pairs the two ops by
their inputs (`regions._pair_other_shape`); no element of one output is an element of the
other, so the finding says what differs (the shapes, and the arguments that made them:
"stride (1, 1) vs (2, 2)") and measures the difference where the two sides' values can
meet again: the first later pair whose outputs have one shape (a pooled feature), else
the model's outputs.
"""

import re

from ..compare import args as _args
from ..result import ArgDiff, Metrics
from ...trace import schema
from .graph import broadcast_shapes_of, is_int, permutations_to
from .layers import _finite, _num

OTHER_SHAPE = "dataflow (other shape)"

# one name for an argument both frameworks give under their own (jax name, torch name)
_SAME_ARGUMENT = {"window_strides": "stride", "rhs_dilation": "dilation",
                  "feature_group_count": "groups", "window_dimensions": "kernel_size"}


class OtherShapes:
    """`other_shape` for `CrossDiffer.search` (see the module docstring)."""

    def other_shape(self, f, i):
        """Complete finding `f` made at the i-th entry of `pairs_list`, a pair of other
        output shapes: the shapes and differing arguments in `f.layer["shape"]` and the
        note; `f.metrics` those of the first later pair of one shape ("where values meet
        again"), else of the two sides' outputs (`stops.py`) where they are one shape and op
        family, that pair named. Returns f."""
        pr = self.p.pairs[self.pairs_list[i][1]]
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        diffs = self.geometry_args(ua.events[0], ub.events[0])   # the op, not its bias add
        f.arguments = diffs or f.arguments
        text = f"shape {_shape(ua.shape)} vs {_shape(ub.shape)}"
        if diffs:
            text = f"{ua.family} {_args.text(diffs)}; {text}"
        meet = None
        later = [(self.p.pairs[k].a, self.p.pairs[k].b, True) for _, k in
                 self.pairs_list[i + 1:] if self.p.pairs[k].by != OTHER_SHAPE]
        outputs = (self._output_unit(0), self._output_unit(1))   # stops.py: where else to meet
        for qa_k, qb_k, paired in later + ([(*outputs, False)] if None not in outputs else []):
            qa, qb = self.ga.units[qa_k], self.gb.units[qb_k]
            if not _one_shape(qa.shape, qb.shape) or not (paired or qa.family == qb.family):
                continue
            m = self.compare_event(qa.rep, qb.rep)["metrics"]
            meet = {"a": int(qa.rep), "b": int(qb.rep), "a_op": qa.label, "b_op": qb.label,
                    "a_module": self.p.unit_module(0, qa_k),
                    "b_module": self.p.unit_module(1, qb_k),
                    "max_abs": _finite(m.get("max_abs")), "max_rel": _finite(m.get("max_rel"))}
            f.metrics = Metrics.from_dict(m)
            break
        f.layer["shape"] = {"a": list(ua.shape), "b": list(ub.shape), "text": text,
                            "meet": meet}
        f.layer["module"] = {"a": self.p.unit_module(0, pr.a), "b": self.p.unit_module(1, pr.b),
                             "a_event": int(ua.rep), "b_event": int(ub.rep),
                             "max_abs": meet and meet["max_abs"],
                             "max_rel": meet and meet["max_rel"]}
        opening = "the same inputs, another result" if f.inputs_match is True else \
            "another result (paired by the user map's structure)"
        f.note = (f"{opening}: {text}" +
                  (f"; where the values meet again, a {meet['a_op']} (event {meet['a']}) <-> "
                   f"b {meet['b_op']} (event {meet['b']}): max abs {_num(meet['max_abs']):.3g}"
                   if meet else "; the values never meet again: no later pair has one shape") +
                  "; " + f.note)
        return f

    def indices_differ(self, f, pr):
        """Complete finding `f` at a lookup pair of one table whose indices were not paired
        (`regions._pair_index_role`): the integer inputs of the two lookup ops compared by
        value, named as the input that differs (position ids that forgot an offset)."""
        ua, ub = self.ga.units[pr.a], self.gb.units[pr.b]
        ra, rb = _int_input(self.ta, ua.rep), _int_input(self.tb, ub.rep)
        if ra is None or rb is None:
            return
        m = self.compare_rows(ra, rb)
        if m is None or m.get("within_tolerance"):
            return
        la, lb = self._label(self.ta, self.sa, ra), self._label(self.tb, self.sb, rb)
        f.inputs_match, f.inputs_bitwise = False, False
        f.inputs_reason = (f"its indices differ: a {la} vs b {lb}: max abs "
                           f"{_num(m.get('max_abs')):.3g} (the same table, other rows)")
        f.layer["indices"] = {"a": la, "b": lb, "max_abs": _finite(m.get("max_abs"))}

    def geometry_args(self, ea, eb):
        """[ArgDiff] of the arguments of two ops of two frameworks that differ, each named
        once and read as numbers: JAX's `window_strides=(1, 1)` against torch's
        `stride=[2, 2]`, `padding=((1, 1), (1, 1))` against `padding=[1, 1]`."""
        pa = _args.split_params(self.ta.string(self.ta.events["params"][ea]))
        pb = _args.split_params(self.tb.string(self.tb.events["params"][eb]))
        na = {_SAME_ARGUMENT.get(k, k): v for k, v in pa.items()}
        out = []
        for k, vb in pb.items():
            va = na.get(k)
            if va is None:
                continue
            ia, ib = _ints(va), _ints(vb)
            if ia is None or ib is None:
                continue
            if k == "padding" and len(ia) == 2 * len(ib):
                ib = tuple(x for v in ib for x in (v, v))      # torch's symmetric padding
            n = max(len(ia), len(ib))
            if len(ia) == 1:
                ia = ia * n
            if len(ib) == 1:
                ib = ib * n
            if ia != ib:
                out.append(ArgDiff(name=k, a=_tuple(ia, va), b=_tuple(ib, vb)))
        return out


def _int_input(t, e):
    """The stored integer input of event e (a gather's indices): its producer's output
    row, or None."""
    for r in t.input_rows(e):
        p = int(r["producer"])
        if p < 0:
            continue
        rows = [v for v in t.value_rows(p, schema.ROLE_OUT)
                if int(v["slot"]) == int(r["producer_slot"])]
        if rows and is_int(t.string(rows[0]["dtype"])):
            return rows[0]
    return None


def _ints(text):
    """The integers of an argument's recorded text, or None where it holds anything else
    (a name, a float, None)."""
    if not re.fullmatch(r"[\s\d,()\[\]-]+", text or ""):
        return None
    found = tuple(int(x) for x in re.findall(r"-?\d+", text))
    return found or None


def _tuple(ints, text):
    return text if len(ints) > 4 else str(ints if len(ints) > 1 else ints[0])


def _shape(shape):
    return "[" + ",".join(str(x) for x in shape) + "]"


def _one_shape(sa, sb):
    """Two outputs compared element by element: one shape, one the other's broadcast, or
    one laid out as the other (a layout, NHWC against NCHW)."""
    return tuple(sa) == tuple(sb) or broadcast_shapes_of(sa, sb) is not None or \
        bool(permutations_to(sa, sb))
