"""The non-finite part of a trace's dataflow: which events made NaN or Inf values, which of
them made them from finite inputs (roots), and which roots' values reach the run's
results.

The first NaN in a trace is often not the one that matters: an attention mask filled with
-Inf, or `where(x > 0, sqrt(x), 0)`, makes non-finite values that the next op absorbs. A
root *persists* when its non-finite values reach an event the run keeps: an optimizer step,
or a value nothing recorded reads again (the loss printed, a call's last output). The
origin is the first root that persists; the roots before it are absorbed.

Edges are the recorded dataflow (`/inputs`) restricted to non-finite values read, plus one
edge from each innermost non-finite equation of a call (nothing inside reads it) to its
call, whose outputs are what later events read. A call with a non-finite equation inside
is never a root itself: its equations say where.
"""

import heapq

import numpy as np

from ...trace import schema

OPTAX_FRAME = "/optax/"
MAX_VISITS = 500_000   # events one search walks at most (a trace whose every later value is NaN)


class NonFiniteGraph:
    """One trace's events with non-finite outputs, their edges and roots (arrays by event)."""

    def __init__(self, t, counts):
        self.t = t
        ev, v = t.events, t.values
        n = self.n = len(ev)
        self.counts = counts
        row_ev = v["event"].astype(np.int64)
        out = v["role"] == schema.ROLE_OUT
        bad_row = (counts.nan > 0) | (counts.inf > 0)
        self.bad_row = bad_row
        self.nan_ev = np.bincount(row_ev[out], weights=np.maximum(counts.nan[out], 0),
                                  minlength=n)[:n].astype(np.int64)
        self.inf_ev = np.bincount(row_ev[out], weights=np.maximum(counts.inf[out], 0),
                                  minlength=n)[:n].astype(np.int64)
        self.bad = (self.nan_ev + self.inf_ev) > 0
        bad_ids = np.flatnonzero(self.bad)
        # containers: a call (or JAX's nested jit / cond equation) holding a non-finite event
        call, parent = ev["call"].astype(np.int64), ev["parent"].astype(np.int64)
        self.call, self.parent = call, parent
        holder = np.zeros(n, bool)
        c = call[bad_ids]
        holder[c[(c >= 0) & (c < n)]] = True
        jax_bad = bad_ids[ev["framework"][bad_ids] == schema.FW_JAX]
        p = parent[jax_bad]
        holder[p[(p >= 0) & (p < n)]] = True
        self.holder = holder & self.bad
        # which value each input row reads, and whether it is non-finite
        inp = t.inputs
        prod = inp["producer"].astype(np.int64)
        real = (prod >= 0) & (prod < n)
        read_bad = np.zeros(len(inp), bool)
        read_known = ~real & (prod != schema.PRODUCER_UNKNOWN)   # literals, constants
        key_out = (row_ev[out] << 20) | (v["slot"][out].astype(np.int64) & 0xFFFFF)
        rows_out = np.flatnonzero(out)
        order = np.argsort(key_out, kind="stable")
        key_sorted = key_out[order]
        k = (prod[real] << 20) | (inp["producer_slot"][real].astype(np.int64) & 0xFFFFF)
        pos = np.searchsorted(key_sorted, k)
        pos_ok = pos < len(key_sorted)
        found = np.zeros(len(k), bool)
        found[pos_ok] = key_sorted[pos[pos_ok]] == k[pos_ok]
        rows = np.full(len(k), -1, np.int64)
        rows[found] = rows_out[order[pos[found]]]
        known = found.copy()
        known[found] = counts.nan[rows[found]] >= 0
        rb = np.zeros(len(k), bool)
        rb[found] = bad_row[rows[found]]
        # a row whose counts are unknown: the producer's other outputs say nothing for sure
        read_bad[real] = rb
        read_known[real] = known
        self.input_rows_read = np.full(len(inp), -1, np.int64)
        self.input_rows_read[np.flatnonzero(real)] = rows
        self.inp = inp
        self.read_bad = read_bad
        self.read_known = read_known
        consumer = inp["event"].astype(np.int64)
        self.any_consumer = np.bincount(prod[real], minlength=n)[:n] > 0
        read_rows = rows[rows >= 0]
        self.row_read = np.zeros(len(v), bool)
        self.row_read[read_rows] = True
        # per event: a non-finite output that no recorded event reads again
        unread_bad = out & bad_row & ~self.row_read
        self.unread_bad = np.zeros(n, bool)
        self.unread_bad[row_ev[unread_bad]] = True
        # non-finite values an event holds as its own inputs (a JAX literal, a collective's
        # sent copy, a call's inputs)
        own_in = v["role"] == schema.ROLE_IN
        self.bad_own_in = np.zeros(n, bool)
        self.bad_own_in[row_ev[own_in & bad_row]] = True
        self.unknown_in = np.zeros(n, bool)
        self.unknown_in[consumer[~read_known]] = True
        # edges: producer -> consumer where the value read is non-finite
        src, dst = prod[read_bad], consumer[read_bad]
        # an innermost non-finite event of a call (nothing reads it) -> its call
        leaf = self.bad & ~self.any_consumer & (call >= 0) & (call < n)
        leaf_ids = np.flatnonzero(leaf)
        up = np.where((ev["framework"][leaf_ids] == schema.FW_JAX) & (parent[leaf_ids] >= 0),
                      parent[leaf_ids], call[leaf_ids])
        src = np.concatenate([src, leaf_ids])
        dst = np.concatenate([dst, up])
        keep = self.bad[dst] & (src != dst)
        src, dst = src[keep], dst[keep]
        self.fed_bad = np.zeros(n, bool)
        self.fed_bad[consumer[read_bad]] = True
        order = np.argsort(src, kind="stable")
        self.e_src, self.e_dst = src[order], dst[order]
        kind = ev["kind"]
        self.roots = np.flatnonzero(self.bad & ~self.holder & ~self.fed_bad)
        self.kind = kind
        self._updates = {}   # per jit call: its equations after the gradient (`phase`)

    # -- one event -------------------------------------------------------------------------
    def consumers(self, e):
        lo, hi = np.searchsorted(self.e_src, [e, e + 1])
        return self.e_dst[lo:hi]

    def phase(self, e):
        """forward / backward / optimizer: inside one JAX jit call, the gradient is the
        equations under `transpose(...)` name stacks, and the update the equations in
        optax's frames or reading what the gradient made (a transform of the user's own)."""
        t, ev = self.t, self.t.events[e]
        if int(ev["kind"]) == schema.KIND_OPTIM or int(ev["phase"]) == schema.PHASE_OPTIM:
            return "optimizer"
        if int(ev["framework"]) == schema.FW_JAX:
            if OPTAX_FRAME in t.string(ev["source"]):
                return "optimizer"
            stack = t.string(ev["name_stack"])
            if "transpose(" in stack:
                return "backward"
            call = int(ev["call"])
            if "jvp(" not in stack and 0 <= call < self.n and e in self._after_gradient(call):
                return "optimizer"
        return schema.PHASE_NAMES.get(int(ev["phase"]), "forward")

    def _after_gradient(self, call):
        """The equations of jit call `call` outside the gradient that read, through the
        dataflow, what its gradient equations made: the update of a train step."""
        if call not in self._updates:
            t = self.t
            inside = np.flatnonzero((self.call == call) & (self.kind == schema.KIND_EQN))
            reached = set()
            for e in inside.tolist():
                stack = t.string(t.events["name_stack"][e])
                if "transpose(" in stack:
                    reached.add(e)
                elif "jvp(" not in stack and any(int(r["producer"]) in reached
                                                 for r in t.input_rows(e)):
                    reached.add(e)
            self._updates[call] = {e for e in reached
                                   if "transpose(" not in t.string(t.events["name_stack"][e])}
        return self._updates[call]

    def kept(self, e):
        """True where event `e`'s non-finite values are kept by the run: an optimizer's
        step, or a non-finite output no recorded event reads again (a printed loss, a
        result); a call's innermost equation leads to its call instead."""
        if self.phase(e) == "optimizer":
            return True
        return bool(self.unread_bad[e]) and not (0 <= self.call[e] < self.n)

    # -- the search ------------------------------------------------------------------------
    def reach(self, root, limit=MAX_VISITS):
        """Walk the non-finite values from `root` in event order (a `Walk`): until the first
        kept event and, from a root that made Inf alone, the first event whose output holds
        NaN where what it read of the walk held none (where Inf turned into NaN)."""
        w = Walk(root)
        want_nan = self.nan_ev[root] == 0
        heap = [root]
        while heap and w.visits < limit:
            e = heapq.heappop(heap)
            w.visits += 1
            if w.kept is None and self.kept(e):
                w.kept = e
            if want_nan and w.nan_at is None and e != root and self.nan_ev[e] and \
                    all(self.nan_ev[p] == 0 for p in w.into.get(e, ())):
                w.nan_at = e
            if w.kept is not None and (w.nan_at is not None or not want_nan):
                return w
            for c in self.consumers(e).tolist():
                w.into.setdefault(c, []).append(e)
                if c not in w.seen:
                    w.seen[c] = e
                    heapq.heappush(heap, c)
        w.exhausted = not heap
        return w

class Walk:
    """What `NonFiniteGraph.reach` found from one root: the events reached (`seen`: each
    with the event it was first reached from), every edge into them (`into`), the first
    kept event (None: absorbed, or the walk stopped at its limit, `exhausted` False) and
    where Inf first turned into NaN (`nan_at`)."""

    def __init__(self, root):
        self.root = root
        self.seen = {root: -1}
        self.into = {}
        self.kept = None
        self.nan_at = None
        self.visits = 0
        self.exhausted = False

    def path(self, end):
        """Events from the root to `end`, as first reached."""
        out = [end]
        while self.seen.get(out[-1], -1) >= 0:
            out.append(self.seen[out[-1]])
        return out[::-1]
