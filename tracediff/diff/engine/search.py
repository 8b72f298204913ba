"""The search for the first divergence: candidates visited in the order of trace a, each
judged by the rules of its kind (`locate.py`'s docstring): eager ops and snapshots as they
are, replayed equations through their compiled call, compiled calls through their replayed
equations and their probe; rounding noise around zero and nondeterministic events skipped.
"""

import dataclasses

import numpy as np

from ...trace import schema
from ..compare import levels as _levels
from ..compare import nearzero as _nearzero
from ..compare import values as compare
from ..compare.args import base_name
from ..compare.values import BITWISE, TOLERANCE
from ..result import CallRef


class DivergenceSearch:
    """`search(level)` and the handlers per event kind (see the module docstring)."""

    def _origin_among(self, events_a, level, depth=0):
        """First origin (inputs match, outputs differ) among these a-events; prefers the
        inner equations of a nested jit origin. Returns (ea, eb, first_diff)."""
        first_diff = None
        for ea in events_a:
            eb = int(self.al.a2b[ea])
            if eb < 0 or self.sa.content[ea] == self.sb.content[eb]:
                continue
            if self.equal_at(ea, eb, level):
                continue
            if self._is_noise(ea):
                continue
            if first_diff is None:
                first_diff = (ea, eb)
            ok, _, bad = self.inputs_match(ea, eb, level)
            if not ok and bad and self.sa.kind[ea] == schema.KIND_EQN and \
                    all("producer_a" not in b for b in bad):
                ok = True   # only its literal constants differ: the program changed here
            if ok:
                kids = np.flatnonzero((self.sa.parent == ea) & (self.sa.kind == schema.KIND_EQN))
                if len(kids) and depth < 16:
                    inner, _, _ = self._origin_among(kids, level, depth + 1)
                    if inner is not None:
                        return inner, first_diff, True
                return (ea, eb), first_diff, True
        return None, first_diff, False

    def search(self, level):
        """(Finding or None, replay-only Finding or None) for one level.

        The candidates (paired events whose content differs) are visited in the order of
        trace a; each goes to the handler of its kind (`SEARCH_BY_KIND`, the rules of
        `locate.py`), which returns the finding, or None to go on."""
        ia, ib = self.candidate_pairs()
        if level == TOLERANCE:
            keep = ~self._fast_within_tolerance(ia, ib)
            ia, ib = ia[keep], ib[keep]
        state = _Search(level, self.ta.events["origin"] == schema.ORIGIN_PROBE)
        phase = f"comparing differing events ({level})"
        self._tell(phase, 0, len(ia))
        for i, (ea, eb) in enumerate(zip(ia.tolist(), ib.tolist())):
            if not i & 1023:
                self._tell(phase, i, len(ia))
            if state.probe[ea] and self.sa.kind[ea] != schema.KIND_EQN:
                continue  # tracediff's own extra program: searched through its call
            if self.noisy is not None and self._is_noise(ea):
                continue
            if self.cast_only(ea, eb):
                continue  # only the dtype changed (a cast): not where values part
            if self._absorbed(ea, eb, level):
                continue  # overwritten or dropped before any op read it: never the headline
            handler = self.SEARCH_BY_KIND.get(int(self.sa.kind[ea]), DivergenceSearch._search_event)
            found = handler(self, ea, eb, state)
            if found is not None:
                return found, state.replay_only
        return None, state.replay_only

    absorbed_state = None   # {level: [first (a event, b event, readers), count]}

    def _absorbed(self, ea, eb, level):
        """True (and remembered) when the difference of paired event ea is overwritten
        before anything reads it: the dataflow links it only to ops that write over that
        argument without reading its values (a weight drawn, then `copy_` of a loaded
        checkpoint over it; `fill_`, `zero_`, a second draw). It never reaches the outputs."""
        if int(self.sa.kind[ea]) not in _ABSORBABLE:
            return False
        readers = self._readers(ea)
        if not len(readers):
            return False
        ops = self.ta.events["op"]
        for r, slot in readers:
            if slot != 0 or base_name(self.ta.string(ops[r])) not in OVERWRITE_FIRST:
                return False
        if self.absorbed_state is None:
            self.absorbed_state = {}
        st = self.absorbed_state.setdefault(level, [None, 0])
        if st[0] is None:
            st[0] = (ea, eb, np.array(sorted({r for r, _ in readers})))
        st[1] += 1
        return True

    def _readers(self, ea):
        """[(event, slot)] of trace a's events that take an output of event `ea` as an
        input (the inputs table)."""
        if getattr(self, "_reader_index", None) is None:
            prod = self.ta.inputs["producer"]
            order = np.argsort(prod, kind="stable")
            self._reader_index = (prod[order], self.ta.inputs["event"][order],
                                  self.ta.inputs["slot"][order])
        prods, events, slots = self._reader_index
        lo, hi = np.searchsorted(prods, [ea, ea + 1])
        return list(zip(events[lo:hi].tolist(), slots[lo:hi].tolist()))

    def _search_event(self, ea, eb, s):
        """What the script saw (eager primitive, torch op, optimizer snapshot, input):
        reported as is when it differs (beyond tolerance: unless it is rounding noise
        around zero, `near_zero`)."""
        if self.equal_at(ea, eb, s.level):
            return None
        if s.level == TOLERANCE and self.near_zero(ea, eb):
            return None
        return self.finding(ea, eb, s.level)

    near_zero_state = None   # nearzero.NearZero of the tolerance search

    def near_zero(self, ea, eb):
        """True (and remembered) when paired event ea, beyond tolerance, is rounding noise
        around zero (`nearzero.judge`): skipped by the tolerance search, shown apart."""
        if self.near_zero_state is None:
            self.near_zero_state = _nearzero.NearZero()
        st = self.near_zero_state
        try:
            why = _nearzero.judge(self, ea, eb, self.input_pairs(ea, eb))
        except (ValueError, TypeError):   # odd values: judged as they are
            why = None
        if why is None:
            return False
        st.count += 1
        if st.first is None:
            st.first = (int(ea), int(eb), why)
        return True

    def _search_eqn(self, ea, eb, s):
        """A replayed equation, or a probe's (`record --probe`, `--jax-values compiled`):
        judged through its compiled call (a probe's: the call it probes). Its call
        differing, it was resolved there (the call comes first); the call matching, it is
        replay-only (the first bitwise difference at the bitwise level, kept for
        information at the tolerance level, never the verdict): compared, never skipped."""
        level = s.level
        c = int(self.sa.call[ea])
        probed = s.probe[ea]
        if probed:   # a probe's equation (record --probe, --jax-values compiled): judged
            c = int(self.sa.parent[c]) if c >= 0 else -1   # by the real call it probes
        cb = int(self.al.a2b[c]) if c >= 0 else -1
        if cb < 0:
            if self.equal_at(ea, eb, level):
                return None
            # no compiled counterpart to judge by (the calls are structured differently
            # in the two runs): the replayed values are the best evidence there is; a
            # nested jit whose inputs match is searched for its inner origin
            inner, _, _ = self._origin_among(np.array([ea]), level)
            ea, eb = inner if inner is not None else (ea, eb)
            return self.finding(ea, eb, level, note=(
                "replayed equation; its enclosing compiled call has no counterpart in b, "
                "so the replayed values are compared"))
        if not self.equal_at(c, cb, level):
            return None  # resolved through its call (cannot happen: the call comes first)
        if level != BITWISE and s.replay_only is not None:
            return None  # only the first replay-only difference is kept: nothing to measure
        if self.equal_at(ea, eb, level):
            return None
        dev = self.ta.event_device(ea) if self.ta.has_devices() else ""
        if dev and dev in self._departed_copies(c, cb, level):
            # the call's global value (one replica) matches, but its copy on this
            # equation's device does not: the script saw it there
            return self.finding(ea, eb, level, note=(
                f"the compiled outputs of the enclosing call (event {c}) match as global "
                f"values, but their copy on {dev} differs: that device departed"))
        note = (f"{'probe-only' if probed else 'replay-only'}: the compiled outputs of the "
                f"enclosing call (event {c}) match{' bitwise' if level == BITWISE else ' within tolerance'}; "
                f"the script did not see this difference")
        f = self.finding(ea, eb, level, note=note)
        if level == BITWISE:
            return f
        if s.replay_only is None:
            s.replay_only = f
        return None

    def _departed_copies(self, ca, cb, level):
        """The devices whose per-device copy of call ca's outputs differs from b's copy
        (same device, shard and replica) at `level`, though the global values match."""
        key = (ca, cb, level)
        cache = self._departed_cache
        if key not in cache:
            out = set()
            if self.tb.has_devices() and _levels.same_hash_function(self.ta, self.tb):
                slots = sorted({int(r["slot"]) for r in self.ta.value_rows(ca, schema.ROLE_OUT)})
                for slot in slots:
                    da, db = self.ta.device_values(ca, slot), self.tb.device_values(cb, slot)
                    by_key = {(v.device, v.shard, v.replica): v for v in db}
                    for v in da:
                        w = by_key.get((v.device, v.shard, v.replica))
                        if w is None or not v.digest or v.digest == w.digest:
                            continue
                        if level == BITWISE:
                            out.add(v.device)
                            continue
                        xa, xb = v.value(), w.value()
                        m = compare.compare_arrays(xa, xb, str(xa.dtype), self.rtol, self.atol,
                                                   ulp=self.ulp)
                        if not m["within_tolerance"]:
                            out.add(v.device)
            cache[key] = out
        return cache[key]

    def _search_call(self, ea, eb, s):
        """A compiled call whose outputs differ: the first of its replayed equations that
        introduces the difference, else its compiled probe, else the call itself."""
        level = s.level
        if self.equal_at(ea, eb, level):
            return None
        eqns = np.flatnonzero((self.sa.call == ea) & (self.sa.kind == schema.KIND_EQN))
        # direct equations of the call (parent = the call, or unset); nested ones
        # are searched through their enclosing jit/cond/scan equation
        eqns = eqns[(self.sa.parent[eqns] == ea) | (self.sa.parent[eqns] < 0)]
        origin, first_diff, _ = self._origin_among(eqns, level)
        call = CallRef(a=ea, b=eb, op=self.ta.string(self.ta.events[ea]["op"]))
        if origin is not None:
            f = self.finding(*origin, level, note=(
                f"first replayed equation of compiled call {call.op!r} (event {ea}) "
                f"whose inputs match and whose outputs differ"))
            f.call = call
            return f
        if first_diff is not None:
            f = self.finding(*first_diff, level, note=(
                f"first differing replayed equation of compiled call {call.op!r} "
                f"(event {ea}); no equation inside it was found to introduce the "
                f"difference on its own"))
            f.call = call
            return f
        if len(eqns):
            f = self._probe_finding(ea, eb, call, level, s.probe)
            if f is not None:
                return f
        note = ("the compiled outputs differ but every replayed equation of this call "
                "matches: the divergence is inside the compiled program (fusion, "
                "compiler rewrites), not at any single equation"
                if len(eqns) else "the compiled outputs differ (no replayed equations "
                "recorded for this call)")
        f = self.finding(ea, eb, level, note=note)
        f.compiled = "replay matches" if len(eqns) else ""
        return f

    # the search's handler per event kind (every other kind: `_search_event`)
    SEARCH_BY_KIND = {schema.KIND_EQN: _search_eqn, schema.KIND_CALL: _search_call}

    def _probe_finding(self, ea, eb, call, level, probe):
        """A compiled call whose replayed equations all match: search its compiled probe
        (`record --probe`, capture/jax/probe.py), the same equations compiled with every
        intermediate as an output, for the first one whose compiled value differs while
        its inputs match. None when the call was not probed on both sides."""
        mine = np.flatnonzero(probe & (self.sa.kind == schema.KIND_CALL) & (self.sa.parent == ea))
        if not len(mine):
            return None
        pa = int(mine[0])
        pb = int(self.al.a2b[pa])
        if pb < 0:
            return None
        eqns = np.flatnonzero((self.sa.call == pa) & (self.sa.parent == pa) &
                              (self.sa.kind == schema.KIND_EQN))
        origin, first_diff, _ = self._origin_among(eqns, level)
        where = f"compiled call {call.op!r} (event {ea})"
        if origin is None and first_diff is None:
            note = ("the compiled outputs differ but every replayed equation matches, and the "
                    "compiled probe of the call (event {}) does not reproduce the difference: "
                    "it lies in how the whole program was fused".format(pa))
            if not self.equal_at(pa, pb, level):
                return None
            f = self.finding(ea, eb, level, note=note)
            f.compiled = "probe does not reproduce"
            return f
        if origin is not None:
            pick, how = origin, "whose inputs match and whose compiled value differs"
        else:
            pick, how = first_diff, "whose compiled value differs (none introduced it on its own)"
        f = self.finding(*pick, level, note=(
            f"every replayed equation of {where} matches; its compiled probe (event {pa}: the "
            f"call's equations compiled with each intermediate as an output) narrows the "
            f"difference to the first equation {how}"))
        f.call = dataclasses.replace(call, probe_a=pa, probe_b=pb)
        name = call.op[len("jit:"):]
        unfaithful = [side for side, t in (("a", self.ta), ("b", self.tb))
                      if name in ((((t.manifest.get("frameworks") or {}).get("jax") or {})
                                   .get("probe") or {}).get("differing_calls") or ())]
        if unfaithful:
            f.note += (f"; caveat: on {' and '.join(unfaithful)} the probe's final outputs are not "
                       f"bitwise those of the real program (the extra outputs changed fusion), so "
                       f"the real program may round elsewhere too")
        return f

    def _is_noise(self, ea):
        """True (and remembered) when event `ea` differs between two runs on a's machine."""
        if self.noisy is None or not self.noisy[ea]:
            return False
        if not isinstance(self.noise_skipped, set):
            self.noise_skipped = set()
        self.noise_skipped.add(int(ea))
        return True


# kinds whose difference can die before it is read: ops, equations, eager primitives
_ABSORBABLE = frozenset({schema.KIND_OP, schema.KIND_EQN, schema.KIND_EAGER})
# torch ops that write over their first argument without reading its values (base names)
OVERWRITE_FIRST = frozenset({"copy", "fill", "zero", "uniform", "normal", "bernoulli",
                             "exponential", "geometric", "cauchy", "log_normal", "random",
                             "set"})


class _Search:
    """The state of one `Differ.search`: its level, the probe events it skips, and the
    first replay-only difference met (the tolerance level keeps it for information)."""

    def __init__(self, level, probe):
        self.level, self.probe, self.replay_only = level, probe, None
