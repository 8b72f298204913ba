"""Pair the computations of two runs of different frameworks (a Flax model and its
PyTorch port) by dataflow, dtype and role.

Why: the two programs run different ops in a different order (an init-time forward on
`jnp.ones`, a bias add vs `addmm`, eight LayerNorm equations vs one aten op, transposed
and permuted weights), so pairing by sequence or by equal bytes pairs the wrong things.
Values anchor the pairing instead, and dataflow carries it forward:

1. Units. The computing ops of each side (byte-moving ops skipped), a matmul or conv
   merged with the bias add that reads it (an operand broadcast from a smaller value, never
   a residual), a jitted `gelu`/`softmax`/... kept whole.
   Optimizer ops are left to the snapshots (align/optroles.py); forward and backward are
   paired separately.
2. Atoms. Every value a unit reads (and the values it was moved from) is fingerprinted:
   dtype and exact bytes, whatever the shape (a reshape or transpose view keeps the
   bytes); integers by value in any width (int32 tokens == int64 tokens, never == a
   float); arrays of 2+ dims left over by the multiset of their elements, confirmed by an
   axis permutation (HWIO kernel == OIHW weight). A fingerprint seen on both sides is an
   atom: the same input or parameter. 0-d values (seeds, counters, hyper-parameters)
   are never atoms. The optimizer's updated parameters are atoms by role. Float values
   each side computes from what only it has, equal within tolerance (Llama's rotary
   cos/sin), are atoms too (`near.py`).
3. Support. A unit's support is the set of atoms it depends on, following the dataflow
   back through byte-moving ops and other units and stopping at atoms; a value only one
   side has (a PRNG key, the ones of an init-time forward) adds a token of its own side,
   so what reads it cannot pair.
4. Classes. Units with the same support and phase compute from the same atoms. In the
   forward (`_pair_forward`), units of the same (op family, size, dtype) pair only when
   their direct inputs pair; where the two sides reach one value by other ops (scale
   before or after a matmul, a composite against one aten op), the points where values
   meet pair, else the last units after the class's last pair, else two modules' outputs,
   each region between compared as one unit. The one unit of a family on each side whose
   direct inputs pair, in corresponding modules, pairs whatever its output shape (a conv of
   another stride: `dataflow (other shape)`); the one lookup of a family whose float inputs
   pair and whose integer indices do not, across classes (`dataflow (indices by role)`).
   Backward units pair by symbol and direct
   inputs (ties to the latest), carrying the module pairs of the forward; a composite's
   last unit pairs only if it is not a term of a sum its module accumulates (`add_any`).
5. A user map (`{"MLP/fc1": "fc1"}`) confines the units of the modules it names to each
   other, never across op families, and pairs what dataflow left there by structure (op
   family and size, then op family alone: units of other shapes too).

Every pair says how it was made (`by`, `how`).
"""

import collections
import dataclasses

import numpy as np

from ..align import sequence as _align
from .atoms import Atoms
from .graph import PHASE_BWD, PHASE_FWD, broadcast_pair, is_int
from .modules import ModuleCorrespondence
from .moved import MovedAtoms
from .near import NearAtoms
from .reads import Reads
from .regions import RegionSteps
from .shapes import OTHER_SHAPE


MAX_FORWARD_PASSES = 4              # sweeps over the forward classes (a later class may feed one)


@dataclasses.dataclass
class Pair:
    a: int            # unit index on a
    b: int            # unit index on b
    by: str           # "dataflow", "dataflow (values meet)", "module output",
    how: str          # "dataflow (composite)", "user map", "structure"
    modules: tuple = None   # (a module, b module) whose outputs a "module output" pair is


class Pairing(RegionSteps, Atoms, MovedAtoms, NearAtoms, ModuleCorrespondence, Reads):
    """The pairs of two `SideGraph`s (see the module docstring); its parts: atoms and
    supports (`atoms.py`), module correspondence and the user map (`modules.py`), what a
    unit or region reads (`reads.py`)."""

    def __init__(self, ga, gb, user_map=None, role_rows=(), agree=None):
        self.ga, self.gb = ga, gb
        self.agree = agree         # agree(row a, row b): equal within tolerance (values meet)
        self._mod_pairs = {}       # a module -> b module, from the paths of paired units
        self._same_value = [None, None]   # per side: (hash, dtype, shape) -> units
        self._terms = [None, None]        # per side: units summed by an add_any (backward)
        self.user_map = list((user_map or {}).items())
        self.atoms = {}            # fingerprint -> atom id
        self.atom_rows = {}        # atom id -> (row a, row b, how)
        self.row_atom = [{}, {}]   # per side: (event, slot, role) -> atom id (permuted matches)
        self.layouts = {}          # (a row key, b row key) -> axis order found for an atom
        self._build_atoms(role_rows)
        self.index_leaves = [set(), set()]   # per side: integer leaves tied by dataflow
        self.origins = [{}, {}]              # per side: value node -> support
        self._merge_moved_atoms()
        for g, s in ((ga, 0), (gb, 1)):
            self._supports(g, s)
        if self._tie_index_leaves():
            for g, s in ((ga, 0), (gb, 1)):
                self._supports(g, s)
        if self._near_atoms():
            for g, s in ((ga, 0), (gb, 1)):
                self._supports(g, s)
        self.pairs = []
        self.pair_of = [dict(), dict()]   # unit index -> pair index, per side
        self.groups = [self._groups(ga, 0), self._groups(gb, 1)]
        self._pair_forward()
        self.module_map = self._module_map()
        self._pair_phase(PHASE_BWD)
        self._pair_user_leftovers()

    # -- pairing ----------------------------------------------------------------------------
    def _symbol(self, g, s, k, with_module):
        u = g.units[k]
        # integers in any width: Flax's int32 argmax is torch's int64 one
        dtype = ("bool" if u.dtype == "bool" else "int") if is_int(u.dtype) else u.dtype
        return (u.family, u.size, dtype, int(self.groups[s][k]),
                self._module_id(s, u.module) if with_module else "")

    def _pair_phase(self, phase):
        ga, gb = self.ga, self.gb
        classes = collections.OrderedDict()
        for g, s in ((ga, 0), (gb, 1)):
            for k, u in enumerate(g.units):
                if u.phase != phase or k in self.pair_of[s]:
                    continue
                sup = g.support[k]
                if not sup or any(x[0] == "l" for x in sup):
                    continue
                classes.setdefault(sup, ([], []))[s].append(k)
        bwd = phase == PHASE_BWD
        for sup, (la, lb) in sorted(classes.items(), key=lambda c: c[1][0][0] if c[1][0] else 1 << 62):
            if not la or not lb:
                continue
            n_atoms = sum(1 for x in sup if x[0] == "a")
            # the same symbol on both sides: the k-th from the end with the k-th from the end
            # (an init-time forward on the same inputs precedes the apply-time one)
            by_sym = collections.defaultdict(lambda: ([], []))
            for s, lst, g in ((0, la, ga), (1, lb, gb)):
                for k in lst:
                    by_sym[self._symbol(g, s, k, bwd)][s].append(k)
            # where the two sides' values of one symbol are apart, the values meet first
            # (Flax scales q's gradient after the matmul, torch the scores' before): the
            # symbol pairs them only if nothing met
            groups = sorted(by_sym.values(), key=lambda v: v[0][0] if v[0] else 1 << 62)
            for strict in (True, False):
                for xs, ys in groups:
                    xs = [k for k in xs if k not in self.pair_of[0]]
                    ys = [k for k in ys if k not in self.pair_of[1]]
                    for ka, kb, score in self._assign(xs, ys) if xs and ys else ():
                        if (strict or not self._tied(ka, kb)) and not self._agree_units(ka, kb):
                            continue    # apart, and then no direct input in common either
                        if not strict and self.crosses(ka, kb):
                            continue    # apart, on either side of a pair where values met
                        self._add(ka, kb, "dataflow",
                                  f"same op family and size, computed from the same {n_atoms} "
                                  f"paired input(s) and parameter(s)" +
                                  ("" if score is None else
                                   f"; {score} of its direct inputs are the same values or "
                                   f"made by paired ops"))
                while strict and self._pair_meeting(la, lb, n_atoms, by_module=True):
                    pass
            # what is left: a composite on one side or both (LayerNorm's equations vs
            # aten::native_layer_norm), paired by its last unit; in the backward, only what
            # follows the last pair of its module and size (a unit before it fed that pair:
            # torch's whole LayerNorm gradient and Flax's terms, both summed into the paired
            # residual add) and no term of a sum (`_sum_terms`)
            left = collections.defaultdict(lambda: ([], []))
            for s, lst, g in ((0, la, ga), (1, lb, gb)):
                terms = self._sum_terms(s) if bwd else ()
                for k in lst:
                    u = g.units[k]
                    key = (u.size, u.dtype, int(self.groups[s][k]),
                           self._module_id(s, u.module) if bwd else "")
                    if k in self.pair_of[s]:
                        if bwd:
                            left[key][s].clear()
                    elif k not in terms and not self._index_unit(s, k):
                        left[key][s].append(k)
            for xs, ys in left.values():
                if xs and ys:
                    self._add(xs[-1], ys[-1], "dataflow (composite)",
                              f"the last of {len(xs)} op(s) of a and {len(ys)} of b computed "
                              f"from the same {n_atoms} paired input(s) and parameter(s)")

    def _tied(self, ka, kb):
        """Units ka of a and kb of b read a value in common: an atom or the output of a pair
        whose values are the same quantity, never of a composite or module-output pair (T5's
        RMSNorm: Flax's `sqrt(v) ** 2` in its jvp and the `rsqrt(v) ** 3` of torch's
        RsqrtBackward0 read the square root and its reciprocal, a composite pair where the
        rounding of a later step keeps them from meeting)."""
        common = self._input_keys(0, ka) & self._input_keys(1, kb)
        return any(key[0] == "a" or self.pairs[key[1]].by not in
                   ("dataflow (composite)", "module output") for key in common)

    def _sum_terms(self, s):
        """Units of side s whose value is one term of a sum that the same module's backward
        accumulates (JAX's `add_any`): a part of a gradient, never the gradient. A pre-LN
        block's LayerNorm transpose adds the residual's cotangent into its own terms, so
        Flax never holds the LayerNorm's whole input gradient that torch's
        `native_layer_norm_backward` returns; the `mul` before the last `add_any` is not it."""
        if self._terms[s] is None:
            g = self.ga if s == 0 else self.gb
            out = set()
            for j, u in enumerate(g.units):
                if u.phase != PHASE_BWD or g.op(u.rep) != "add_any":
                    continue
                for _, _, nd in g.input_nodes(u):
                    out.update(v for v in self._producers(g, s, nd)
                               if v != j and g.units[v].module == u.module)
            self._terms[s] = out
        return self._terms[s]

    # -- the forward: what the two sides compute ----------------------------------------
    def _pair_forward(self):
        """Forward units pair by what they compute, not by their op sequences. Inside each
        class (units computed from the same atoms), repeatedly:

        1. strict: units of the same symbol whose direct inputs pair (the same atoms,
           values made by paired units); a unit that reads an unpaired unit's value waits;
        2. values meet: where the two sides reach one value by different op sequences
           (Flax `(q/sqrt d) k^T` against torch's `(q k^T)/sqrt d`, a LayerNorm's equations
           against `native_layer_norm`), units of the same size whose outputs agree within
           tolerance pair, and what lies between them and the last pairs is one region;
        3. module output: where nothing inside meets (a port bug, fused against unfused
           attention), the last units of two corresponding modules pair, their region
           compared as one unit.

        Never two ops whose inputs do not pair: a pair made by 2 or 3 compares its region's
        inputs (`region_inputs`), and consumers pair strictly after it."""
        for _ in range(MAX_FORWARD_PASSES):
            if not self._sweep_forward() and not self._pair_index_role(*self._forward_units()):
                break

    def _sweep_forward(self):
        """One sweep over the forward classes (`_pair_forward`); whether it paired any."""
        before = len(self.pairs)
        for sup, (la, lb) in self._classes(PHASE_FWD):
            n_atoms = sum(1 for x in sup if x[0] == "a")
            while self._pair_strict(la, lb, n_atoms) or self._pair_broadcast(la, lb, n_atoms) \
                    or self._pair_meeting(la, lb, n_atoms) \
                    or self._pair_other_shape(la, lb, n_atoms) \
                    or self._pair_composite(la, lb, n_atoms) \
                    or self._pair_module_output(la, lb, n_atoms):
                pass
        return len(self.pairs) > before

    def _forward_units(self):
        """([a's], [b's]) forward units that read no value only their side has, across
        classes (indices one side computes from the ids and the other is given put two
        lookups of one table in two classes)."""
        return tuple([k for k, u in enumerate(g.units) if u.phase == PHASE_FWD and
                      g.support[k] and not any(x[0] == "l" for x in g.support[k])]
                     for g in (self.ga, self.gb))

    def _classes(self, phase):
        """[(support, ([a units], [b units]))] of the units of one phase (paired ones too: the
        last pair of a class bounds what is left over), in the order of a's first unit;
        units that read a value only one side has are left out."""
        classes = collections.OrderedDict()
        for g, s in ((self.ga, 0), (self.gb, 1)):
            for k, u in enumerate(g.units):
                if u.phase != phase:
                    continue
                sup = g.support[k]
                if not sup or any(x[0] == "l" for x in sup):
                    continue
                classes.setdefault(sup, ([], []))[s].append(k)
        return [(sup, lists) for sup, lists in
                sorted(classes.items(), key=lambda c: c[1][0][0] if c[1][0] else 1 << 62)
                if lists[0] and lists[1]]

    def _pair_strict(self, la, lb, n_atoms):
        by_sym = collections.defaultdict(lambda: ([], []))
        for s, lst, g in ((0, la, self.ga), (1, lb, self.gb)):
            for k in lst:
                if k not in self.pair_of[s]:
                    by_sym[self._symbol(g, s, k, False)][s].append(k)
        new = False
        for xs, ys in by_sym.values():
            if not xs or not ys:
                continue
            keyed = ({}, {})
            for s, lst in ((0, xs), (1, ys)):
                for k in lst:
                    keys = self._complete_keys(s, k)
                    if keys is not None:
                        keyed[s].setdefault(keys, []).append(k)
            for keys, xl in keyed[0].items():
                for x, y in self._same_inputs(xl, keyed[1].get(keys, [])):
                    self._add(x, y, "dataflow",
                              f"same op family and size, computed from the same {n_atoms} paired "
                              f"input(s) and parameter(s); its {len(keys)} direct input(s) are "
                              f"the same values or made by paired ops")
                    new = True
        return new

    def _same_inputs(self, xl, yl):
        """[(a unit, b unit)] of one symbol whose direct inputs are the same: the k-th from
        the end with the k-th from the end (an init-time forward on the same inputs precedes
        the apply-time one); where one side has more, those whose values agree first (under
        `jvp`, JAX's `x ** 3` of a tanh GELU has its derivative's `x ** 2` beside it, read
        from the same x, and torch's forward only the cube)."""
        if len(xl) == len(yl) or not xl or not yl:
            return list(zip(reversed(xl), reversed(yl)))
        out, used = [], set()
        for y in reversed(yl):
            x = next((x for x in reversed(xl) if x not in used and self._agree_units(x, y)), None)
            if x is not None:
                used.add(x)
                out.append((x, y))
        if out:
            return out
        return list(zip(reversed(xl), reversed(yl)))

    def _index_unit(self, s, k):
        """An integer or boolean result (a mask, index arithmetic, a bounds check): it pairs
        only where dataflow ties it (`_pair_strict`: the same op family, direct inputs that
        pair), never because its values equal another's or it ends a region: a Flax `lt`
        bounds check and a torch `ne` pad mask read the same tokens and can hold the same
        bits, yet compute different things."""
        return is_int((self.ga if s == 0 else self.gb).units[k].dtype)

    def _add(self, ka, kb, by, how, modules=None):
        ga_ = self.groups[0][ka]
        if ga_ >= 0:
            by, how = "user map", f"{how}; within the modules the map names " \
                                  f"({self.user_map[ga_][0]!r} -> {self.user_map[ga_][1]!r})"
        self.pair_of[0][ka] = len(self.pairs)
        self.pair_of[1][kb] = len(self.pairs)
        self.pairs.append(Pair(ka, kb, by, how, modules))
        self._learn_modules(self.unit_module(0, ka), self.unit_module(1, kb))

    def _pair_user_leftovers(self):
        """Units of mapped modules that dataflow did not pair: by structure, in order from
        the end, never across op families."""
        for i in range(len(self.user_map)):
            la = [k for k in np.flatnonzero(self.groups[0] == i).tolist() if k not in self.pair_of[0]]
            lb = [k for k in np.flatnonzero(self.groups[1] == i).tolist() if k not in self.pair_of[1]]
            if not la or not lb:
                continue
            for phase in (PHASE_FWD, PHASE_BWD):
                # by op family and size, then what is left by op family alone: a map pairs
                # units of other shapes too (a conv with another stride, [2, 6, 6, 8] against
                # [2, 8, 3, 3]: the finding says so, `shapes.py`)
                for sized in (True, False):
                    self._align_user_units(i, [k for k in la if self.ga.units[k].phase == phase
                                               and k not in self.pair_of[0]],
                                           [k for k in lb if self.gb.units[k].phase == phase
                                            and k not in self.pair_of[1]], sized)

    def _align_user_units(self, i, pa, pb, sized):
        """Pair units pa of a with pb of b, of the modules user-map entry i names, by
        structure from the end: op family (and size where `sized`)."""
        def sym(u):
            return (u.family, u.size) if sized else u.family
        ids = {}
        sym_a = np.array([ids.setdefault(sym(self.ga.units[k]), len(ids)) for k in pa], np.uint64)
        sym_b = np.array([ids.setdefault(sym(self.gb.units[k]), len(ids)) for k in pb], np.uint64)
        if not len(sym_a) or not len(sym_b):
            return
        ia, ib, _ = _align.align_arrays(sym_a[::-1], sym_b[::-1])
        for x, y in zip((len(pa) - 1 - ia)[::-1].tolist(), (len(pb) - 1 - ib)[::-1].tolist()):
            ux, uy = self.ga.units[pa[x]], self.gb.units[pb[y]]
            other = ux.shape != uy.shape and not broadcast_pair(ux.shape, uy.shape) and \
                ux.size != uy.size
            self.pair_of[0][pa[x]] = len(self.pairs)
            self.pair_of[1][pb[y]] = len(self.pairs)
            self.pairs.append(Pair(pa[x], pb[y], OTHER_SHAPE if other else "user map",
                                   f"by structure (op family{' and size' if sized else ''}) "
                                   f"within the modules the map names ({self.user_map[i][0]!r} "
                                   f"-> {self.user_map[i][1]!r}); their inputs were not paired "
                                   f"by value" + (f"; its output has another shape "
                                                  f"({list(ux.shape)} and {list(uy.shape)})"
                                                  if other else "")))
