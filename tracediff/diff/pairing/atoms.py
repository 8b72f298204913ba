"""Atoms and supports of cross-framework pairing (steps 2 and 3 of `dataflow.py`'s
docstring): a value both sides read with the same fingerprint (bytes, integer values, or
the same elements in another axis order) is an atom; a unit's support is the set of atoms
it depends on, through byte-moving ops and other units.
"""

import collections

import numpy as np

from ...trace import schema
from ...trace.values import digest
from ..differ import comparable
from .graph import PHASE_FWD, _size, broadcasts_to, find_layout, is_int

MAX_DEPTH = 200             # passthrough hops followed back from one value
MAX_SELECT_DEPTH = 6                # units followed back for `_selected_constants`
MAX_FINGERPRINT_BYTES = 256 << 20   # values read to fingerprint permuted arrays
MAX_SUPPORT_ELEMENTS = 20_000_000   # atoms held by the distinct supports of one side
MAX_GIVEN_HOPS = 16                 # byte-moving ops followed back to call a value given



class Atoms:
    """The atoms and supports of a `Pairing` (see the module docstring)."""

    def atom(self, side, row):
        """Atom id of a value row of one side, or None."""
        if row is None:
            return None
        g = self.ga if side == 0 else self.gb
        a = self.row_atom[side].get((int(row["event"]), int(row["slot"]), int(row["role"])))
        if a is not None:
            return a
        k = g.key(row)
        return self.atoms.get(k) if k is not None else None

    def _build_atoms(self, role_rows):
        seen = [collections.OrderedDict(), collections.OrderedDict()]   # key -> row
        rows_of = [[], []]
        computed = [set(), set()]
        read_in = [{}, {}]       # per side: key -> module of the first unit that reads it
        for g, s in ((self.ga, 0), (self.gb, 1)):
            visited = set()
            for u in g.units:
                for _, _, nd in g.input_nodes(u):
                    for row, by_unit in g.walk_rows(nd, seen=visited):
                        rows_of[s].append(row)
                        k = g.key(row)
                        if k is not None and k not in seen[s]:
                            seen[s][k] = row
                            read_in[s][k] = u.module
                        if k is not None and by_unit:
                            computed[s].add(k)
        # a value both sides compute (a layer's output that happens to be equal) is not a
        # cut: what reads it depends on what computed it, as on the other side
        self.computed = computed[0] & computed[1]
        self.computed_on = computed      # per side: keys of values a unit of that side computed
        for k, row in seen[0].items():
            rb = seen[1].get(k)
            if rb is not None:
                aid = len(self.atom_rows)
                self.atoms[k] = aid
                sa_, sb_ = self.ga.shape(row), self.gb.shape(rb)
                how = "equal bytes" if sa_ == sb_ else ("equal values" if k[0] == "i" and
                                                        self.ga.t.string(row["dtype"]) !=
                                                        self.gb.t.string(rb["dtype"])
                                                        else "equal bytes, other shape")
                if k[0] == "i" and self.ga.t.string(row["dtype"]) != self.gb.t.string(rb["dtype"]):
                    how = (f"equal values ({self.ga.t.string(row['dtype'])} vs "
                           f"{self.gb.t.string(rb['dtype'])})")
                self.atom_rows[aid] = (row, rb, how)
        self._permuted_atoms(rows_of, seen)
        self._broadcast_atoms(rows_of)
        self._parameter_atoms(seen, read_in, computed)
        for ra, rb in role_rows:          # updated parameters, by optimizer role
            ka, kb = self.ga.key(ra), self.gb.key(rb)
            if ka is None or kb is None:
                continue
            aid = self.atoms.get(ka, self.atoms.get(kb))
            if aid is None:
                aid = len(self.atom_rows)
                self.atom_rows[aid] = (ra, rb, "the same parameter after an optimizer step "
                                                "(by role)")
            self.atoms.setdefault(ka, aid)
            self.atoms.setdefault(kb, aid)

    def _unmatched(self, g, rows, signature):
        """{signature: {key: row}} of one side's stored float values that no atom holds yet,
        grouped by `signature(g, key, row)` (None: not a candidate)."""
        out = {}
        for row in rows:
            k = g.key(row)
            if k is None or k[0] != "b" or k in self.atoms or not comparable(row):
                continue
            sig = signature(g, k, row)
            if sig is not None:
                out.setdefault(sig, {})[k] = row
        return out

    def _permuted_atoms(self, rows_of, seen):
        """Float arrays of 2+ dims without an exact match: the same elements in another
        axis order (a conv kernel HWIO vs OIHW) make an atom too."""
        def sig(g, k, row):
            return (k[1], int(row["nbytes"])) if len(g.shape(row)) >= 2 else None

        pa, pb = (self._unmatched(g, rows_of[s], sig) for g, s in ((self.ga, 0), (self.gb, 1)))
        budget = MAX_FINGERPRINT_BYTES
        for sig in pa.keys() & pb.keys():
            fps = {}
            for g, s, rows in ((self.ga, 0, pa[sig]), (self.gb, 1, pb[sig])):
                for k, row in rows.items():
                    budget -= int(row["nbytes"])
                    if budget < 0:
                        return
                    x = np.asarray(g.reader.read(row))
                    bits = np.sort(np.ascontiguousarray(x).reshape(-1).view(
                        {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(x.itemsize, np.uint8)))
                    fps.setdefault(digest(bits.tobytes()), ([], []))[s].append((row, x))
            for fa_list, fb_list in fps.values():
                for (ra, xa), (rb, xb) in zip(fa_list, fb_list):
                    p = find_layout(xa, xb)
                    if p is None:
                        continue
                    aid = len(self.atom_rows)
                    self.atom_rows[aid] = (ra, rb, f"equal after permuting axes {tuple(p)}")
                    self.row_atom[0][(int(ra["event"]), int(ra["slot"]), int(ra["role"]))] = aid
                    self.row_atom[1][(int(rb["event"]), int(rb["slot"]), int(rb["role"]))] = aid
                    # every row of either side with these exact bytes is that atom
                    self.atoms.setdefault(self.ga.key(ra), aid)
                    self.atoms.setdefault(self.gb.key(rb), aid)

    def _broadcast_atoms(self, rows_of):
        """Float values without an exact match where one side's is the other's broadcast
        along dimensions of size 1 (Flax's position embeddings looked up for positions of
        the batch's shape [2, 8] against torch's for its [1, 8] buffer: each row of the
        [2, 8, 32] output is the [1, 8, 32] one) make an atom too: the same value, read by
        what follows on both sides. A constant (every element equal) broadcasts to
        anything and is never one; integers and bools never pair by value this way."""
        def sig(g, k, row):
            shape = g.shape(row)
            return (k[1], shape) if len(shape) and _size(shape) >= 2 else None

        pa, pb = (self._unmatched(g, rows_of[s], sig) for g, s in ((self.ga, 0), (self.gb, 1)))
        budget = [MAX_FINGERPRINT_BYTES]

        def read(g, row):
            budget[0] -= int(row["nbytes"])
            return np.asarray(g.reader.read(row)) if budget[0] >= 0 else None

        for (dt, sa), (dtb, sb) in [(x, y) for x in pa for y in pb]:
            if dt != dtb or sa == sb:
                continue
            if broadcasts_to(sb, sa):
                small_side, shape_small, shape_big = 1, sb, sa
            elif broadcasts_to(sa, sb):
                small_side, shape_small, shape_big = 0, sa, sb
            else:
                continue
            smalls = (pa, pb)[small_side][(dt, shape_small)]
            bigs = (pa, pb)[1 - small_side][(dt, shape_big)]
            gs, gbig = (self.ga, self.gb)[small_side], (self.ga, self.gb)[1 - small_side]
            index = {}
            for k, row in smalls.items():
                if k in self.atoms:
                    continue
                x = read(gs, row)
                if x is None:
                    return
                if x.size and (x.reshape(-1)[:1] == x.reshape(-1)).all():
                    continue                   # a constant: it broadcasts to anything
                index.setdefault(digest(np.ascontiguousarray(x).tobytes()), []).append((k, row, x))
            if not index:
                continue
            lead = len(shape_big) - len(shape_small)
            src = tuple(0 if i < lead or shape_small[i - lead] == 1 else slice(None)
                        for i in range(len(shape_big)))
            for kb, rb in bigs.items():
                if kb in self.atoms:
                    continue
                y = read(gbig, rb)
                if y is None:
                    return
                first = np.ascontiguousarray(y[src])
                for k, row, x in index.get(digest(first.tobytes()), ()):
                    if k in self.atoms or not np.array_equal(
                            np.broadcast_to(x.reshape(shape_small), shape_big).view(np.uint8),
                            y.view(np.uint8)):
                        continue
                    ra, rb_ = (row, rb) if small_side == 0 else (rb, row)
                    aid = len(self.atom_rows)
                    self.atom_rows[aid] = (ra, rb_, f"equal after broadcasting "
                                                    f"{list(shape_small)} to {list(shape_big)}")
                    self.atoms.setdefault(self.ga.key(ra), aid)
                    self.atoms.setdefault(self.gb.key(rb_), aid)
                    break

    def _tie_index_leaves(self):
        """Integer values only one side was given, where the other side builds its own or
        was given its own (Flax's `position_ids` of the batch's shape against torch's
        position buffer; positions off by one in a port): where one unit of each side of
        the same family reads them with the same atoms otherwise (the lookup into the same
        table), dataflow ties them: they are that unit's index operand on both sides, never
        paired by their values. Returns whether any was tied (the supports are then
        computed again, those values adding nothing)."""
        cand = [{}, {}]
        for g, s in ((self.ga, 0), (self.gb, 1)):
            for k, u in enumerate(g.units):
                sup = g.support[k]
                if u.phase != PHASE_FWD or not sup:
                    continue
                atoms = frozenset(x for x in sup if x[0] == "a")
                own = [x[2] for x in sup if x[0] == "l"]
                rows = [g.nodes[nd][0] if nd in g.nodes else None for nd in own]
                if atoms and all(r is not None and is_int(g.t.string(r["dtype"]))
                                 for r in rows):
                    cand[s].setdefault((u.family, atoms), []).append(own)

        def one(owns):
            """The one unit's own values (an init-time forward on constants beside the
            apply-time one on given values: the given ones), or None when ambiguous."""
            given = [o for o in owns if o]
            return given[0] if len(given) == 1 else owns[0] if len(owns) == 1 else None

        tied = False
        for key, owns_a in cand[0].items():
            xa, xb = one(owns_a), one(cand[1].get(key, []))
            if xa is not None and xb is not None and (xa or xb):
                self.index_leaves[0].update(xa)
                self.index_leaves[1].update(xb)
                tied = True
        return tied

    def _parameter_atoms(self, seen, read_in, computed):
        """A value each side was given, equal to nothing of the other side, read first by
        the same module (paths aligned from the common end, a's root dropped) and the only
        such value of its size and dtype there on either side: the same parameter, converted
        wrong (a running variance as a standard deviation, a flipped kernel). An atom, so
        the module pairs and its difference is found there; before, it was a value of one
        side only and nothing after it paired (INCONCLUSIVE)."""
        def pending(g, s):
            out = collections.defaultdict(list)
            for k, row in seen[s].items():
                if k[0] != "b" or k in self.atoms or k in computed[s] or not comparable(row) \
                        or not len(g.shape(row)) or not _given(g, int(row["event"])):
                    continue
                path = [c for c in read_in[s][k].split("/") if c]
                out[(int(row["nbytes"]), k[1])].append((path, row))
            return out

        pa, pb = pending(self.ga, 0), pending(self.gb, 1)
        for sig in pa.keys() & pb.keys():
            for pth_b, rb in pb[sig]:
                if not pth_b:
                    continue
                hits = [ra for pth_a, ra in pa[sig] if pth_a[-len(pth_b):] == pth_b and
                        len(pth_a) - len(pth_b) in (0, 1)]
                others = [r for pth, r in pb[sig] if pth == pth_b]
                if len(hits) != 1 or len(others) != 1:
                    continue
                ra = hits[0]
                aid = len(self.atom_rows)
                self.atom_rows[aid] = (ra, rb, "the same module's parameter, other values")
                self.atoms.setdefault(self.ga.key(ra), aid)
                self.atoms.setdefault(self.gb.key(rb), aid)

    # -- support ----------------------------------------------------------------------------
    def _supports(self, g, s):
        memo = self.origins[s] = {}     # value node -> its support (`near.py` reads them)
        intern = {}

        def origins(nd, depth=0):
            hit = memo.get(nd)
            if hit is not None:
                return hit
            row, preds, term = g.nodes[nd]
            scalar = row is not None and not len(g.shape(row))
            a = self.atom(s, row)
            cast = a is not None and _int_cast(g, row) and \
                _union([origins(q, depth + 1) for q in preds])
            if a is not None and term is not None and term[0] == "const" and \
                    row is not None and int(g.kind[int(row["event"])]) == schema.KIND_EQN:
                # a fill of literals inside a jaxpr (a jvp rule's ones and zeros) is a
                # constant of the computation, never a parameter, whatever bytes it has: a
                # training-mode BatchNorm's `max(0, var)` derivative selects between fills
                # with the bytes of the scale's and bias's init, and read as those atoms its
                # backward left torch's class (fixtures/port_batchnorm.py, step 1)
                a = None
            if a is not None and _selected_constants(g, nd) and _given_other(self, s, a):
                a = None          # what reads it reads what chose it
            if cast:
                res = cast        # a float made of an integer atom: that atom
            elif a is not None and g.key(row) not in self.computed:
                res = frozenset([("a", self.canon_atom(a))])
            elif a is not None:
                # computed on both sides: what computed it, unless that was constants
                # alone: then a float value itself (a table both sides build); an integer
                # or bool (an arange, an iota: index constants of every kind, torch's
                # position buffer and Flax's causal mask alike) is a constant, not the same
                # input: it adds nothing
                res = (g.support[term[1]] if term is not None and term[0] == "unit"
                       and g.support[term[1]] is not None else
                       _union([origins(q, depth + 1) for q in preds]))
                if not res and g.key(row)[0] != "i":
                    res = frozenset([("a", a)])
            elif term is not None and term[0] == "unit":
                res = g.support[term[1]]
                if res is None:
                    res = frozenset([("l", s, nd)])
            elif term is not None and term[0] == "const":
                res = frozenset()
            elif term is not None and nd in self.index_leaves[s]:
                res = frozenset()     # tied to the other side's index (`_tie_index_leaves`)
            elif term is not None or depth > MAX_DEPTH:
                # an input only this side has; 0-d ones (seeds, counters, hyper-parameters)
                # are parameters of the computation, not data
                res = frozenset() if scalar else frozenset([("l", s, nd)])
            else:   # moved bytes: where they came from (constants contribute nothing)
                res = _union([origins(q, depth + 1) for q in preds])
            res = intern.setdefault(res, res)
            memo[nd] = res
            return res

        budget = MAX_SUPPORT_ELEMENTS   # bounded work on a hostile trace: new sets only
        for k, u in enumerate(g.units):
            if budget <= 0:                # what is left stays unpaired (never wrong)
                g.support[k] = frozenset([("l", s, ("budget", k))])
                continue
            parts = [origins(nd) for _, _, nd in g.input_nodes(u)]
            sup = _union(parts)
            if sup not in intern:
                intern[sup] = sup
                budget -= len(sup)
            g.support[k] = intern[sup]


def _selected_constants(g, nd, depth=0):
    """Is value node `nd` of a JAX side made of fills of literals chosen by predicates the
    data decides (units whose float operands are such fills or such values, and which read
    at least one integer or boolean value): 0 for the predicate's (0 or 1 when it is not).
    Flax's derivative of a training-mode BatchNorm's `max(0, var)` selects ones and zeros and
    divides the two; they have the bytes of the BatchNorm's scale and bias at init, and read
    as those parameters, the BatchNorm's backward left torch's class (fixtures/
    port_batchnorm.py, step 1: a term paired with `native_batch_norm_backward`). Only where
    the other side was given those bytes (`_given_other`): a mask both sides build by other
    ops (`where(tokens == 0, ...)`) is one value. A constant no predicate chooses (a loss's
    seed gradient) and a forward value of data (torch's `1 - mask`) stay atoms too."""
    if g.fw != schema.FW_JAX or depth > MAX_SELECT_DEPTH:
        return False
    row, preds, term = g.nodes[nd]
    if term is None:          # moved bytes: what they were moved from
        return bool(preds) and all(_selected_constants(g, q, depth + 1) for q in preds)
    if term[0] != "unit":
        return False
    u = g.units[term[1]]
    if is_int(u.dtype) or int(g.kind[u.rep]) != schema.KIND_EQN:
        return False
    chosen = False
    for _, _, q in g.input_nodes(u):
        qrow, _, qterm = g.nodes[q]
        if qrow is not None and is_int(g.t.string(qrow["dtype"])):
            chosen = True     # a predicate (or an index) the data decides
        elif qterm is not None and qterm[0] == "const":
            continue
        elif _selected_constants(g, q, depth + 1):
            chosen = True
        else:
            return False
    return chosen


def _given_other(p, s, a):
    """Is atom `a`'s value on the side other than `s` one that side was given (a parameter,
    an input), not one it computed (a padding mask both sides build: then the two are one
    value)?"""
    rows = p.atom_rows.get(a)
    other = rows[1 - s] if rows else None
    go = p.gb if s == 0 else p.ga
    return other is not None and 0 <= int(other["event"]) < go.n and \
        _given(go, int(other["event"]))


def _given(g, ev, depth=0):
    """Is event `ev`'s value given to this side (moved from inputs only, no unit of the side
    upstream): a parameter or an input, not a computed value seen through a reshape."""
    if depth > MAX_GIVEN_HOPS or int(g.unit_of[ev]) >= 0:
        return False
    for r in g.t.input_rows(ev):
        p = int(r["producer"])
        if 0 <= p < g.n and g.mask[p] and not _given(g, p, depth + 1):
            return False
    return True


def _union(parts):
    parts = [p for p in parts if p]
    if not parts:
        return frozenset()
    big = max(parts, key=len)
    if all(p <= big for p in parts):
        return big
    return frozenset().union(*parts)




CASTS = {"convert_element_type", "_to_copy", "to", "type_as"}


def _int_cast(g, row):
    """A float value converted from an integer one (a 0/1 mask made float): equal bytes on
    both sides say the same integers were converted, not that the two are one input. HF
    BERT eager: torch's attention mask as float [2, 1, 1, 12] has the bytes of the Flax
    loss's mask as float [2, 12, 1]; as an input of its own it kept torch's attention from
    the class Flax's (built from the integer mask) is in, and nothing in the attention
    paired (26 % of the JAX units). What reads it reads the integer atom."""
    if row is None:
        return False
    e = int(row["event"])
    if e < 0 or g.op(e).split("::")[-1].split(".")[0] not in CASTS:
        return False
    if is_int(g.t.string(row["dtype"])):
        return False
    for r in g.t.input_rows(e):
        p = int(r["producer"])
        for v in (g.t.value_rows(p, schema.ROLE_OUT) if p >= 0 else ()):
            if int(v["slot"]) == int(r["producer_slot"]) and is_int(g.t.string(v["dtype"])):
                return True
    return False
