"""Dataflow back from a value, on one side of a cross-framework comparison: the value
nodes a unit reads (producer, slot, read as a call's argument) and how each came to be: made
by a unit, an input of this side, a fill of literals, or moved from other values (followed
back through byte-moving ops, and from a call or nested jit to the equation inside that
produced the same bytes). The part of `SideGraph` (`graph.py`) that `dataflow.py` walks.
"""

import numpy as np

from ...trace import schema


class ValueNodes:
    """The value nodes of a `SideGraph` (see the module docstring)."""

    def input_nodes(self, unit):
        """[(consumer event, slot, node)] of the values a unit reads from outside it."""
        hit = self._inputs.get(unit.rep)
        if hit is not None:
            return hit
        inside = set(unit.events)
        out = []
        for e in unit.events:
            unread = self.unread_slots(e)
            for r in self.t.input_rows(e):
                p, ps = int(r["producer"]), int(r["producer_slot"])
                if p in inside or p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST) or \
                        int(r["slot"]) in unread:
                    continue
                out.append((e, int(r["slot"]), self.node(e, p, ps)))
        self._inputs[unit.rep] = out
        return out

    def node(self, consumer, p, ps):
        """A value as read by `consumer`: (producer, slot, read as the call's argument)."""
        arg = 0 <= p < self.n and self.kind[p] == schema.KIND_CALL and \
            consumer is not None and self.call[consumer] == p
        key = (p, ps, bool(arg), consumer if p < 0 else -1)
        if key not in self.nodes:
            self.nodes[key] = self._expand(consumer, p, ps, arg)
        return key

    def _expand(self, consumer, p, ps, arg):
        """(row, [pred nodes], term) of a value node; term: ('unit', k), ('leaf',) (an input
        of this side), ('const',) (made of literals) or None (follow the preds)."""
        t = self.t
        if p < 0 or p >= self.n or not self.mask[p]:
            return None, [], ("leaf",)
        if arg:
            row = self.side.value_row(p, ps, schema.ROLE_IN)
            preds = [self.node(p, int(r["producer"]), int(r["producer_slot"]))
                     for r in t.input_rows(p) if int(r["slot"]) == ps and int(r["producer"]) >= 0]
            return row, preds, (None if preds else ("leaf",))
        row = self.side.value_row(p, ps)
        u = int(self.unit_of[p])
        if u >= 0:
            return row, [], ("unit", u)
        kind = int(self.kind[p])
        if kind in (schema.KIND_INPUT, schema.KIND_OPTIM):
            return row, [], ("leaf",)
        ins = [r for r in t.input_rows(p) if int(r["producer"]) >= 0]
        if kind == schema.KIND_CALL or (kind == schema.KIND_EQN and self.has_kids[p]):
            kid = self._kid_with(p, row)
            if kid is not None:
                return row, [self.node(None, kid[0], kid[1])], None
            preds = [self.node(p, int(r["producer"]), int(r["producer_slot"])) for r in ins]
            return row, preds, (None if preds else ("leaf",))
        src = self.copied_input(p)
        if src is not None:         # a concatenation with empty arrays: a copy of one input
            ins = [r for r in ins if int(r["slot"]) == src]
        elif self.fam_of.get(int(t.events["op"][p])) is not None:
            return row, [], ("leaf",)   # an op paired elsewhere (optimizer) or not at all
        if self.op(p).split(".", 1)[0] in ("aten::copy_", "copy_"):
            ins = [r for r in ins if int(r["slot"]) == 1] or ins
        preds = [self.node(p, int(r["producer"]), int(r["producer_slot"])) for r in ins]
        if not preds and all(int(r["producer"]) in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST)
                             for r in t.input_rows(p)):
            return row, [], ("const",)   # a fill of literals (zeros, ones, a broadcast 0.0)
        return row, preds, (None if preds else ("leaf",))

    def copied_input(self, e):
        """The input slot whose bytes a computing op only copies, or None: it reads empty
        arrays and one other, and its output holds exactly that one's value (dtype, shape,
        hash): torch's KV cache, `cat([empty, k])` on the first call. Such an op moves
        bytes; what reads it reads that input. (An op that happens to return its input,
        `max(x, 0)` of positive x, still computes: it reads no empty array.)"""
        if self.fam_of.get(int(self.t.events["op"][e])) is None or self.has_kids[e]:
            return None
        out = self.side.value_row(e, 0)
        if out is None or not int(out["hash"]) or int(out["nbytes"]) == 0:
            return None
        found, empty = None, False
        for r in self.t.input_rows(e):
            p, ps = int(r["producer"]), int(r["producer_slot"])
            if p in (schema.PRODUCER_LITERAL, schema.PRODUCER_CONST):
                continue
            row = self.side.value_row(p, ps) if 0 <= p < self.n else None
            if row is None:
                return None
            if int(row["nbytes"]) == 0 and len(self.shape(row)):
                empty = True          # an empty array: contributes nothing
                continue
            if found is not None or int(row["hash"]) != int(out["hash"]) or \
                    int(row["dtype"]) != int(out["dtype"]) or \
                    int(row["shape"]) != int(out["shape"]):
                return None
            found = int(r["slot"])
        return found if empty else None

    def _kid_with(self, container, row):
        """(event, slot) of the equation inside a call or nested jit that produced the same
        bytes as the container's output `row` (compiled == replayed), or None."""
        if row is None:
            return None
        table = self._kid_by_hash.get(container)
        if table is None:
            table = {}
            kids = self._kids(container)
            for k in kids.tolist():
                for r in self.t.value_rows(k, schema.ROLE_OUT):
                    table[(int(r["hash"]), int(r["dtype"]), int(r["shape"]))] = (k, int(r["slot"]))
            self._kid_by_hash[container] = table
        return table.get((int(row["hash"]), int(row["dtype"]), int(row["shape"])))

    def _kids(self, container):
        """The equations whose parent is `container` (a call or a nested jit), from an
        index built once (not a scan of the trace per container)."""
        if self._by_parent is None:
            eqn = np.flatnonzero(self.kind == schema.KIND_EQN)
            par = self.parent[eqn]
            order = np.argsort(par, kind="stable")
            self._by_parent = (par[order], eqn[order])
        keys, vals = self._by_parent
        lo, hi = np.searchsorted(keys, [container, container + 1])
        return vals[lo:hi]

    def walk_rows(self, node, limit=8, seen=None):
        """[(row, made by a unit)] of a value node and of the values it was moved from (a
        few hops); nodes in `seen` (updated) are skipped."""
        out, stack = [], [(node, 0)]
        seen = set() if seen is None else seen
        while stack:
            nd, d = stack.pop()
            if nd in seen:
                continue
            seen.add(nd)
            row, preds, term = self.nodes[nd]
            if row is not None:
                out.append((row, term is not None and term[0] == "unit"))
            if term is None and d < limit:
                stack.extend((q, d + 1) for q in preds)
        return out
