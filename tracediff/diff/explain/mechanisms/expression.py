"""The fused expression a compiled-probe op ends (`t * rate + offset` for the probed `add`).

The XLA program may have computed it as one fused operation, so its exact reference is the
expression evaluated from its original operands (`Expr.exact`), not the last op applied to
the already rounded product; `expression` follows add/sub/mul/neg equations of the same
probe back from the origin (at most `MAX_EXPR_NODES` ops).
"""

import numpy as np

from ....trace import schema
from .numerics import _cast, _wide_dtype, fma32, fma64

MAX_EXPR_NODES = 8         # ops of a fused expression followed back from the origin
ARITH_OPS = {"add", "sub", "mul", "neg"}   # ops a fused expression is followed through


# -- fused expressions (compiled probes) ----------------------------------------------------

class Expr:
    """An elementwise expression (add/sub/mul/neg) over recorded arrays: the fused
    computation a compiled-probe op ends. `args` are Expr nodes or leaves
    (array, producer event)."""

    def __init__(self, op, args, event):
        self.op, self.args, self.event = op, args, event
        self.out = ""
        self.target = None

    def nodes(self):
        return 1 + sum(a.nodes() for a in self.args if isinstance(a, Expr))

    def leaves(self):
        out = []
        for a in self.args:
            out += a.leaves() if isinstance(a, Expr) else [a[0]]
        return out

    def with_leaves(self, values):
        it = iter(values)

        def rebuild(node):
            args = [rebuild(a) if isinstance(a, Expr) else (next(it), a[1]) for a in node.args]
            e = Expr(node.op, args, node.event)
            e.out, e.target = node.out, node.target
            return e

        return rebuild(self)

    def text(self):
        def arg(a):
            return a.text() if isinstance(a, Expr) else (f"#{a[1]}" if a[1] >= 0 else "literal")
        return f"{self.op}({', '.join(arg(a) for a in self.args)})"

    def has_contraction(self):
        return any(node.op in ("add", "sub") and any(isinstance(a, Expr) and a.op == "mul"
                                                      for a in node.args)
                   for node in self._all())

    def _all(self):
        yield self
        for a in self.args:
            if isinstance(a, Expr):
                yield from a._all()

    def evaluate(self, mode, dtype=None, contract_right=False):
        """mode "separate": every op rounded to its dtype; "fma": each add/sub of a mul
        rounded once (fused); "exact": in float64 (long double for float64) throughout."""
        dtype = dtype or self.out or "float32"
        wide = _wide_dtype(dtype)
        with np.errstate(all="ignore"):
            if mode == "fma" and self.op in ("add", "sub") and len(self.args) == 2:
                order = (1, 0) if contract_right else (0, 1)
                for i in order:
                    m, other = self.args[i], self.args[1 - i]
                    if isinstance(m, Expr) and m.op == "mul" and len(m.args) == 2:
                        x, y = (self._val(v, mode, dtype, contract_right) for v in m.args)
                        c = self._val(other, mode, dtype, contract_right)
                        if self.op == "sub":
                            if i == 0:
                                c = -c
                            else:
                                x = -x
                        f = fma32 if dtype == "float32" else fma64 if dtype == "float64" else None
                        if f is None:
                            break
                        return f(*np.broadcast_arrays(x, y, c))
            vals = [self._val(a, mode, dtype, contract_right) for a in self.args]
            if mode == "exact":
                vals = [np.asarray(v).astype(wide) for v in vals]
            else:
                vals = [_cast(v, dtype) for v in vals]
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply}.get(self.op)
            r = np.negative(vals[0]) if self.op == "neg" else fn(*vals)
            return r if mode == "exact" else _cast(r, dtype)

    def _val(self, a, mode, dtype, contract_right):
        if isinstance(a, Expr):
            return a.evaluate(mode, dtype, contract_right)
        x = np.asarray(a[0])
        return x.astype(_wide_dtype(dtype)) if mode == "exact" else _cast(x, dtype)

    def exact(self):
        """The expression's exact value (float64; long double for float64 operands): the
        reference for a fused op, from its original operands."""
        return self.evaluate("exact")

    def contracted(self):
        if not self.has_contraction() or self.out not in ("float32", "float64"):
            return
        left = self.evaluate("fma")
        yield "a*b + c rounded once", _cast(left, self.out)
        right = self.evaluate("fma", contract_right=True)
        if not np.array_equal(left, right, equal_nan=True):
            yield "a*b + c rounded once (the other product contracted)", _cast(right, self.out)


def expression(trace, ev, inputs_of):
    """The fused expression that compiled-probe event `ev` ends, followed back through
    add/sub/mul/neg equations of the same probe (at most MAX_EXPR_NODES ops); None when
    the event is not a probe value or reads no such equation. `inputs_of(event)` gives an
    event's recorded input arrays."""
    e = trace.event(ev)
    if e["origin"] != "probe" or e["op"] not in ARITH_OPS:
        return None
    count = [1]

    def build(i, info):
        arrays = inputs_of(i)
        producers = {int(r["slot"]): int(r["producer"]) for r in trace.input_rows(i)}
        args = []
        for slot, x in enumerate(arrays):
            p = producers.get(slot, schema.PRODUCER_UNKNOWN)
            if p >= 0 and count[0] < MAX_EXPR_NODES:
                pe = trace.event(p)
                if pe["origin"] == "probe" and pe["kind"] == "eqn" and \
                        pe["parent"] == info["parent"] and pe["op"] in ARITH_OPS:
                    count[0] += 1
                    args.append(build(p, pe))
                    continue
            args.append((np.asarray(x), p))
        return Expr(info["op"], args, i)

    root = build(ev, e)
    if root.nodes() < 2:
        return None
    return root
