"""What a unit of a cross-framework pairing reads: its direct inputs as atoms and pairs
(to choose among candidates, `_assign`), the value it shares with a paired unit that
computed the same thing (`pair_key`), and the region of unpaired units before it with the
inputs that region reads from outside (compared when a pair says "introduced here").
"""

import collections

from .graph import is_int

MAX_UPSTREAM = 64      # units followed back from one unit to see if a pair would cross


class Reads:
    """What the units and regions of a `Pairing` read (see the module docstring)."""

    def _complete_keys(self, s, k, indices_apart=False):
        """What unit k reads directly, as a sorted tuple of ('a', atom) / ('p', pair), or
        None while it reads a value of an unpaired unit. 0-d values and constants add
        nothing. `indices_apart`: its integer inputs are left out, and the keys are None
        unless one of them is unpaired (a lookup whose indices one side computes)."""
        g = self.ga if s == 0 else self.gb
        keys, unpaired_ints = [], False
        for _, _, nd in g.input_nodes(g.units[k]):
            row = g.nodes[nd][0]
            if row is not None and not len(g.shape(row)):
                continue
            a, prods = self._read(g, s, nd)
            if indices_apart and row is not None and is_int(g.t.string(row["dtype"])):
                unpaired_ints = unpaired_ints or a is None and not any(
                    self.pair_key(s, v) is not None for v in prods)
                continue
            if a is not None:
                keys.append(("a", a))
                continue
            for v in prods:
                pr = self.pair_key(s, v)
                if pr is not None:
                    keys.append(("p", pr))
                elif g.support[v]:
                    return None
        if indices_apart and not unpaired_ints:
            return None
        return tuple(sorted(set(keys)))

    def pair_key(self, s, k):
        """The pair index of unit k of side s, or of a paired unit of that side that computed
        the same value from the same atoms (Flax recomputes the attention mask's bias in
        every layer, torch computes it once); None."""
        pr = self.pair_of[s].get(k)
        if pr is not None:
            return pr
        g = self.ga if s == 0 else self.gb
        idx = self._same_value[s]
        if idx is None:
            idx = self._same_value[s] = collections.defaultdict(list)
            for j in range(len(g.units)):
                row = self.out_row(s, j)
                if row is not None and int(row["hash"]):
                    idx[(int(row["hash"]), int(row["dtype"]), int(row["shape"]))].append(j)
        row = self.out_row(s, k)
        if row is None or not int(row["hash"]):
            return None
        for j in idx.get((int(row["hash"]), int(row["dtype"]), int(row["shape"])), ()):
            pr = self.pair_of[s].get(j)
            if pr is not None and g.support[j] == g.support[k]:
                return pr
        return None

    def out_row(self, s, k):
        g = self.ga if s == 0 else self.gb
        return g.side.value_row(g.units[k].rep, 0)

    MAX_SCORED = 10000

    def _assign(self, xs, ys):
        """[(a unit, b unit, score)] of one symbol in one class. Several candidates: the
        pairs whose direct inputs agree best (the same atoms, values made by paired units:
        a residual add, not the LayerNorm bias add beside it), ties going to the latest
        (an init-time forward precedes the apply-time one). One each: paired outright, its
        score what they read in common (none: `_pair_phase` pairs them only where their
        values agree; T5's `sqrt(v) ** 2` in Flax's jvp against the `rsqrt(v) ** 3` of
        torch's RsqrtBackward0 read the same paired region and compute other things)."""
        if len(xs) == 1 and len(ys) == 1:
            return [(xs[0], ys[0], len(self._input_keys(0, xs[0]) & self._input_keys(1, ys[0])))]
        if len(xs) * len(ys) > self.MAX_SCORED:
            return [(x, y, None) for x, y in zip(reversed(xs), reversed(ys))]
        ka = [self._input_keys(0, x) for x in xs]
        kb = [self._input_keys(1, y) for y in ys]
        cands = []
        for i, x in enumerate(xs):
            for j, y in enumerate(ys):
                common = len(ka[i] & kb[j])
                score = common - len(ka[i] - kb[j]) - len(kb[j] - ka[i])
                cands.append((-score, -(i + j), -i, x, y, common))
        cands.sort()
        out, used_a, used_b = [], set(), set()
        for _, _, _, x, y, common in cands:
            if x not in used_a and y not in used_b:
                used_a.add(x)
                used_b.add(y)
                out.append((x, y, common))
        return sorted(out)

    def _input_keys(self, s, k):
        """What unit k reads directly: ('a', atom) for a value paired by value, ('p', pair)
        for a value made by a paired unit; unpaired producers and constants add nothing."""
        g = self.ga if s == 0 else self.gb
        keys = set()
        for _, _, nd in g.input_nodes(g.units[k]):
            a, prods = self._read(g, s, nd)
            if a is not None:
                keys.add(("a", a))
                continue
            for v in prods:
                pr = self.pair_of[s].get(v)
                if pr is not None:
                    keys.add(("p", pr))
        return keys

    # -- regions ----------------------------------------------------------------------------
    def region(self, s, k, limit=64):
        """Unit k of side s and the unpaired units of its class that feed it (a composite
        on this side), in order."""
        g = self.ga if s == 0 else self.gb
        sup = g.support[k]
        out, stack = {k}, [k]
        while stack and len(out) < limit:
            u = stack.pop()
            for _, _, nd in g.input_nodes(g.units[u]):
                for v in self._producers(g, s, nd):
                    if v not in out and self.pair_key(s, v) is None and \
                            g.support[v] is not None and g.support[v] <= sup:
                        out.add(v)
                        stack.append(v)
        return sorted(out)

    def _upstream(self, s, k, limit=MAX_UPSTREAM):
        """Units of side s that unit k reads from, directly or through other units (at most
        `limit`, nearest first)."""
        g = self.ga if s == 0 else self.gb
        out, frontier = [], [k]
        seen = {k}
        while frontier and len(out) < limit:
            nxt = []
            for u in frontier:
                for _, _, nd in g.input_nodes(g.units[u]):
                    for v in self._producers(g, s, nd):
                        if v not in seen:
                            seen.add(v)
                            out.append(v)
                            nxt.append(v)
            frontier = nxt
        return set(out[:limit])

    def crosses(self, ka, kb):
        """Would pairing ka with kb cross a pair made already: a unit upstream of one is
        paired with a unit downstream of the other? Torch scales the scores' gradient
        after `_softmax_backward_data` (which met the end of Flax's softmax transpose);
        Flax's `div` inside that transpose is upstream of the meeting, torch's `div` after
        it: the same symbol, never one value."""
        for s, k, other in ((0, ka, kb), (1, kb, ka)):
            for v in self._upstream(s, k):
                pr = self.pair_of[s].get(v)
                if pr is None:
                    continue
                w = self.pairs[pr].b if s == 0 else self.pairs[pr].a
                if other in self._upstream(1 - s, w):
                    return True
        return False

    def _read(self, g, s, nd):
        """(atom, []) for a value a unit reads at node `nd` as an atom, else (None, the units
        it comes from). An integer or boolean value both sides compute (a mask, `ids ==
        eos`) is read as what its producer computed, not as an atom: equal bits alone never
        tie two readers (torch may read the same mask converted to int, other bits; two
        unrelated masks may hold the same ones)."""
        row = g.nodes[nd][0]
        a = self.atom(s, row)
        if a is None or self._computed_index(g, row):
            prods = self._producers(g, s, nd)
            if prods:
                return None, prods
            if a is None:
                return self._moved_atom(g, s, nd), []
        return a, []

    def _moved_atom(self, g, s, nd):
        """The one float atom a value no unit made was moved from (a transpose, a slice), or
        None: Flax's kernel [in, out] read as is and torch's weight read through `t()` are
        one parameter's reads even where the kernel holds the weight's bytes untransposed
        (a port that forgot the transpose: the matmuls pair and their outputs differ)."""
        origin = self.origins[s].get(nd)
        row = g.nodes[nd][0]
        key = g.key(row) if row is not None else None
        if key is None or key[0] != "b" or not origin or len(origin) != 1:
            return None
        (item,) = origin
        return item[1] if item[0] == "a" else None

    def _computed_index(self, g, row):
        """An integer or boolean value a unit computed on each side (`_read`)."""
        key = g.key(row)
        return key is not None and key[0] == "i" and key in self.computed

    def _producers(self, g, s, nd, depth=0):
        """Units a value node comes from, through byte-moving ops (stops at atoms, but for
        integer and boolean values both sides compute: `_read`)."""
        row, preds, term = g.nodes[nd]
        if depth > 16 or (self.atom(s, row) is not None and not self._computed_index(g, row)):
            return []
        if term is not None:
            return [term[1]] if term[0] == "unit" else []
        out = []
        for q in preds:
            out += self._producers(g, s, q, depth + 1)
        return out

    def region_inputs(self, s, k):
        """[(consumer event, slot, row, key)] read by unit k's region from outside it; key:
        ('atom', id), ('pair', index) for a value made by a paired unit, or None."""
        g = self.ga if s == 0 else self.gb
        units = self.region(s, k)
        inside = set(units)
        out = []
        for v in units:
            for e, slot, nd in g.input_nodes(g.units[v]):
                row, preds, term = g.nodes[nd]
                if row is not None and not len(g.shape(row)):
                    continue          # 0-d: a scalar parameter of the op
                a = self.atom(s, row)
                prods = self._producers(g, s, nd) if a is None else ()
                if a is None and not prods:   # moved from one atom (a copy, a transpose)
                    a = self._moved_atom(g, s, nd)
                if a is not None:
                    out.append((e, slot, row, ("atom", a)))
                    continue
                if prods and all(p in inside for p in prods):
                    continue
                pk = [self.pair_key(s, p) for p in prods]
                key = ("pair", pk[0]) if len(pk) == 1 and pk[0] is not None else None
                out.append((e, slot, row, key))
        return out
