"""Values each side computes from what only it has, equal within tolerance: one atom.

Why: torch's Llama computes its rotary cos and sin on every call from an `inv_freq`
buffer it made at init (from constants); Flax gathers rows of a sin/cos table built in
numpy (an input only Flax has). The two are the same numbers, rounded differently, so
they are no atom by bytes, and neither has a paired producer: nothing that reads them
paired, and everything after layer 0's rotary embedding stayed unpaired (INCONCLUSIVE at
17 %). A float value read by a unit whose origin is a value only its side has (or
constants alone), equal within tolerance to such a value of the other side, with the
same shape or one the other's broadcast (dimensions of size 1 dropped:
`graph.broadcast_shapes_of`), is an atom: what reads it pairs by dataflow and is compared.
At least one of the two must come from a value only its side has (two values both made
of constants add nothing to a support already); a constant (every element equal) is
never one; integers and bools never pair by value (dataflow only, `atoms.py`).

Such values that do not agree (a rotary table built with another base) are no atom, and
nothing that reads them pairs. They are kept (`tables`), and `stops.py` pairs them by role
once the pairing is known: read by ops of one family whose other inputs pair (the
`q * cos` of both sides).
"""

import numpy as np

from ..differ import comparable
from .graph import PHASE_FWD, _size, broadcast_shapes_of

MAX_NEAR_BYTES = 64 << 20          # values read to look for near atoms
MAX_NEAR_COMPARISONS = 2000        # pairs of candidates compared
MAX_TABLES = 256                   # candidate tables that do not agree, kept for stops.py


class NearAtoms:
    """`_near_atoms` (mixed into `Pairing`, after the supports are known)."""

    def _near_candidates(self, g, s):
        """{key: (row, own)} of side s's float values read by forward units that no atom
        holds, made by this side alone: from a value only it has (`own`) or from constants."""
        memo = self.origins[s]
        out = {}
        for u in g.units:
            if u.phase != PHASE_FWD:
                continue
            for _, _, nd in g.input_nodes(u):
                row = g.nodes[nd][0]
                origin = memo.get(nd)
                if row is None or origin is None or not comparable(row):
                    continue
                k = g.key(row)
                if k is None or k[0] != "b" or k in self.atoms or k in out or \
                        _size(g.shape(row)) < 2:
                    continue
                own = any(x[0] == "l" for x in origin)
                if own and any(x[0] == "a" for x in origin):
                    continue            # computed from atoms too: dataflow pairs it
                if own or not origin:
                    out[k] = (row, own)
        return out

    def _near_atoms(self):
        """Make the near atoms (see the module docstring); returns whether any was made
        (the supports are then computed again)."""
        self.tables = []           # [(a key, row a, b key, row b, max abs)]: not agreeing
        if self.agree is None:
            return False
        ca = self._near_candidates(self.ga, 0)
        cb = self._near_candidates(self.gb, 1)
        if not ca or not cb:
            return False
        budget = [MAX_NEAR_BYTES, MAX_NEAR_COMPARISONS]
        arrays = {}

        def varied(g, k, row):
            """The value as numpy, or None: a constant, or past the byte budget."""
            if k not in arrays:
                budget[0] -= int(row["nbytes"])
                x = np.asarray(g.reader.read(row)) if budget[0] >= 0 else None
                arrays[k] = x if x is not None and x.size >= 2 and \
                    not (x.reshape(-1)[:1] == x.reshape(-1)).all() else None
            return arrays[k]

        made, used_b = False, set()
        for ka, (ra, own_a) in ca.items():
            sa, dta = self.ga.shape(ra), self.ga.t.string(ra["dtype"])
            for kb, (rb, own_b) in cb.items():
                sb = self.gb.shape(rb)
                if kb in used_b or not (own_a or own_b) or \
                        self.gb.t.string(rb["dtype"]) != dta or \
                        (sa != sb and broadcast_shapes_of(sa, sb) is None):
                    continue
                xa, xb = varied(self.ga, ka, ra), varied(self.gb, kb, rb)
                if xa is None or xb is None:
                    continue
                budget[1] -= 1
                if budget[0] < 0 or budget[1] < 0:
                    return made
                if not _sample_close(xa, xb) or not self.agree(ra, rb):
                    self._table_by_role(ka, ra, xa, kb, rb, xb)
                    continue
                aid = len(self.atom_rows)
                self.atom_rows[aid] = (ra, rb, "equal within tolerance"
                                       + ("" if sa == sb else f" ({list(sa)} and {list(sb)})")
                                       + ", each side computing it from values of its own")
                self.atoms[ka] = self.atoms[kb] = aid
                used_b.add(kb)
                made = True
                break
        return made

    def _table_by_role(self, ka, ra, xa, kb, rb, xb):
        """Keep (ra, rb), two such values that do not agree, as a candidate table pair with
        their max abs difference: `stops.py` pairs them by role once the pairing is known."""
        if len(self.tables) < MAX_TABLES:
            self.tables.append((ka, ra, kb, rb, _max_abs(xa, xb)))


def _max_abs(xa, xb):
    shapes = (xa.shape, xb.shape) if xa.shape == xb.shape else \
        broadcast_shapes_of(xa.shape, xb.shape)
    a, b = np.broadcast_arrays(xa.reshape(shapes[0]), xb.reshape(shapes[1]))
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _sample_close(xa, xb, n=256):
    """Do `n` elements spread over the two arrays agree roughly (rtol 1e-3), b laid out as a
    (same order, size-1 dimensions dropped, broadcast)? A cheap test before the comparison
    at tolerance, and no other axis order ever."""
    shapes = (xa.shape, xb.shape) if xa.shape == xb.shape else \
        broadcast_shapes_of(xa.shape, xb.shape)
    a, b = np.broadcast_arrays(xa.reshape(shapes[0]), xb.reshape(shapes[1]))
    a, b = a.reshape(-1), b.reshape(-1)
    idx = np.linspace(0, a.size - 1, min(a.size, n)).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.allclose(a[idx].astype(np.float64), b[idx].astype(np.float64),
                                rtol=1e-3, atol=1e-6))
