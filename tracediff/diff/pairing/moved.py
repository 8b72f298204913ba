"""Atoms one side moves from another atom: one atom in the supports.

Why: HF BERT's eager torch attention converts the int64 padding mask to float32 (`_to_copy`)
before building its additive mask; the Flax loss converts the same mask to float32 too.
The float mask is then an atom of its own (equal bytes on both sides), and support stops at
atoms: torch's attention depended on the float mask, Flax's (which reads the int mask
directly) on the int one, so the scores, softmax and context of every layer had no class
in common and nothing after q, k and v paired (INCONCLUSIVE at 26 %). A value moved (by
byte-moving ops and dtype conversions only) from exactly one atom on either side is that
atom for supports: both sides' readers then depend on the same input. Only the support
changes; the atoms themselves (what pairs as an input, reports) stay apart.
"""

MAX_HOPS = 16          # moved nodes followed back from one atom's value


class MovedAtoms:
    """`_merge_moved_atoms` and `canon_atom` (mixed into `Pairing`, before the supports)."""

    def canon_atom(self, aid):
        """The atom that stands for `aid` in supports (itself unless merged)."""
        canon = getattr(self, "_canon", None)
        return aid if not canon else canon.get(aid, aid)

    def _merge_moved_atoms(self):
        """Merge each atom with the one atom its value was moved from, on either side
        (see the module docstring); atoms computed on both sides are left alone."""
        parent = {}

        def find(a):
            while parent.get(a, a) != a:
                a = parent[a]
            return a

        for g, s in ((self.ga, 0), (self.gb, 1)):
            for nd, (row, preds, term) in list(g.nodes.items()):
                if term is not None or not preds or row is None:
                    continue
                a = self._plain_atom(g, s, row)
                if a is None:
                    continue
                below = set()
                if not self._atoms_below(g, s, preds, below, 0) or len(below) != 1:
                    continue
                b = find(below.pop())
                a = find(a)
                if a != b:
                    parent[a] = b          # the value it was moved from is the root
        self._canon = {a: find(a) for a in parent}
        return bool(self._canon)

    def _plain_atom(self, g, s, row):
        a = self.atom(s, row)
        return None if a is None or g.key(row) in self.computed else a

    def _atoms_below(self, g, s, preds, out, depth):
        """Add to `out` the first atom on every path back from `preds` through moved nodes;
        False where a path ends elsewhere (a unit, an input no atom holds, too deep)."""
        if depth > MAX_HOPS:
            return False
        for q in preds:
            row, qpreds, term = g.nodes[q]
            a = self._plain_atom(g, s, row) if row is not None else None
            if a is not None:
                out.add(a)
            elif term is not None and term[0] == "const":
                continue
            elif term is not None or not qpreds or \
                    not self._atoms_below(g, s, qpreds, out, depth + 1):
                return False
        return True
