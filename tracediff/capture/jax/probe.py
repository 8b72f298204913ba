"""Compiled probes: narrow a compiled-call divergence below the call (`record --probe REGEX`).

Replay runs a call's equations one by one. When two machines' compiled outputs differ
while every replayed equation agrees, the difference lives in how XLA compiled the whole
program (fusion, algebraic rewrites, vectorised code for the ISA), so no replayed
equation can show it. A probe compiles the call's jaxpr once more, with the outputs of
every equation (nested jits inlined, cond/while/scan kept whole) as extra program
outputs, runs that program on the call's real inputs, and records the compiled
intermediates as a `probe:<name>` call event (parent: the real call) with one event per
equation (origin `probe`), shaped like the replayed ones. `locate` searches a probe when
the replay of its call finds nothing, and names the first equation whose compiled
intermediate differs while its inputs match.

Caveat, measured per call and written to the manifest (`probe`): extra outputs change
what XLA may fuse, so the probe program is not the script's program; the manifest says
for how many probed calls the probe's final outputs equal the real compiled outputs
bitwise (when they do, the probe computed the same numbers as the script).
"""

import os
import re

import numpy as np

from ...trace import schema, values
from . import digest_groups, digest_programs, digest_results, internals, xla_stats
from .device_digests import one_device
from .digested import Digested
from .optax_tags import OPTAX_TAG

# `_Plan`s on (the default); TRACEDIFF_JAX_EMIT_PLAN=0 writes every event through `_emit`
_PLANS_ON = os.environ.get("TRACEDIFF_JAX_EMIT_PLAN", "1") != "0"


class Prober:
    """Builds, caches and records the probe program of the calls whose name matches."""

    def __init__(self, capture, pattern, values_mode=False):
        self.capture = capture
        # values_mode (`record --jax-values compiled`): the probe *is* how the call's
        # equations get their values (no op-by-op replay); optax tags are taken from it
        self.values_mode = values_mode
        self.pattern = pattern
        self._re = re.compile(pattern)
        self._programs = {}   # id(closed jaxpr) -> (closed jaxpr, jitted probe program, mask)
        self._plans = {}      # (id(closed), name stack, source, device) -> (closed, writer, _Plan)
        self._device = None   # the recorded call's one device (`DigestGroups.accepts`)
        self.calls = self.equations = self.same_as_compiled = 0
        self.differs_from_compiled = []
        self.errors = []

    def wants(self, name):
        return self._re.search(name) is not None

    def manifest(self):
        return {"pattern": self.pattern, "calls": self.calls, "equations": self.equations,
                "final_outputs_equal_compiled": self.same_as_compiled,
                "final_outputs_differ_from_compiled": len(self.differs_from_compiled),
                "differing_calls": self.differs_from_compiled[:10], "errors": self.errors[:10],
                "note": "probe values come from the call's jaxpr compiled with every equation's "
                        "outputs as program outputs; fusion may differ from the real program"}

    # -- the probe program -------------------------------------------------------------------
    def _program(self, closed):
        hit = self._programs.get(id(closed))
        if hit is not None and hit[0] is closed:
            return hit[1:]

        # values hashed on the device: returned for digest_groups.py where they fit in
        # memory, else digested here (packed; level full: hashed, small ones joined)
        digest = self.values_mode and self.capture.digests is not None
        full = self.capture.session.writer.level == "full"
        mask = []   # per found value: digested on the device (filled while tracing)
        out_at = []  # per final output: its value's place in the packed result, or None
        # level full, per digested value (made while tracing): (shape, dtype), its byte
        # count, and its byte offset in the joined buffer or None
        avals, nbytes, starts = [], [], []
        # level stats: [True] where the program returns its digested values, to be digested
        # by group programs (digest_groups.py) after it; [False]: digested inside
        after = [False]
        # level full, values returned: the program that joins the small ones (a Future)
        joiner = [None]
        full_meta = (avals, nbytes, starts, joiner) if digest and full else None

        # statistics in the program only off the CPU: there they save moving every byte
        # across the bus; on the CPU XLA's extra reductions were measured dearer than
        # numpy's on the host (docs/performance.md), and the bytes are in host memory
        with_stats = self.values_mode and self.capture.session.writer.level == "stats" and \
            xla_stats.in_program()

        def program(*args, inside=False):
            found, tags = [], []
            outs = self._walk(closed, list(args), found, tags)
            if digest:
                # every value of a hashable dtype is digested, optax-tagged ones too;
                # `at`: a value's place among them (a final output that is an equation's
                # value takes that value's words)
                mask[:] = [digest_results.dtype_ok(x.dtype) for x in found]
                at, n = {}, 0
                for x, m in zip(found, mask):
                    if m:
                        at.setdefault(id(x), n)
                        n += 1
            if digest and full:
                return _traced_full(self.capture.digests.groups, self._device, outs, found,
                                    mask, at, out_at, full_meta, after, inside)
            if digest:
                # digested here (the optimizer step's rows take their words: `Ref`), and
                # the program's final outputs where they are not equation outputs already
                # (the probe call's rows): one program a call, no second pass over the
                # same values (out_at made afresh: both variants trace this)
                more, out_at[:] = [], []
                for x in outs:
                    if not digest_results.dtype_ok(x.dtype):
                        out_at.append(None)
                    elif id(x) in at:
                        out_at.append(at[id(x)])
                    else:
                        out_at.append(n + len(more))
                        more.append(x)
                kept = [x for x, m in zip(found, mask) if m] + more
                rest = [None if m else x for x, m in zip(found, mask)]
                if not inside:
                    groups = self.capture.digests.groups
                    after[0] = groups is not None and groups.accepts(kept, self._device)
                    if after[0]:
                        return outs, rest, kept
                return outs, rest, digest_programs.packed(kept, True, inside=True)
            if with_stats:  # statistics computed by XLA next to the values (xla_stats.py)
                return outs, found, [xla_stats.stats_vector(x) if xla_stats.wants(x) else None
                                     for x in found]
            return outs, found

        fn = self.capture.programs.jit(program)
        # a program called more than digest_groups.INSIDE_AFTER_CALLS times with its values
        # returned is compiled again, digesting them inside (`record`)
        fn_inside = self.capture.programs.jit(lambda *a: program(*a, inside=True)) \
            if digest else None
        hit = (fn, (mask if digest else None), out_at, full_meta, after, fn_inside, [0])
        self._programs[id(closed)] = (closed, *hit)
        return hit

    def _walk(self, closed, vals, found, tags=None):
        """Trace the equations of `closed` (under jax.jit), appending every equation's
        outputs to `found` in the order `_emit` consumes them (inner equations first)."""
        from jax.extend.core import Literal

        jaxpr = closed.jaxpr
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, vals))

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in jaxpr.eqns:
            site = self.capture.site(eqn)
            if site.mode == "skip":
                continue
            ins = [read(v) for v in eqn.invars]
            outs = self._walk(site.sub, ins, found, tags) if site.mode == "call" else \
                self.capture.bind(eqn, ins)
            found.extend(outs)
            if tags is not None:
                tags.extend([_is_tag(site, eqn)] * len(outs))
            for v, x in zip(eqn.outvars, outs):
                if type(v).__name__ != "DropVar":
                    env[v] = x
        return [read(v) for v in jaxpr.outvars]

    # -- recording ---------------------------------------------------------------------------
    def start(self, name, closed, args):
        """Start compiling the values program of `closed` for these arguments in a
        background thread, where it is not compiled yet (a program's first call), so that
        the script's own program compiles meanwhile (`_impl_hook` runs it first, where it
        donates nothing; on a TPU v5e a 4096-wide MLP step's two programs took 4.2 and
        3.2 s one after the other). Returns whether it started."""
        try:
            self._device = one_device(args) if self.capture.digests is not None else None
            return self._program(closed)[0].start(*args)
        except Exception as exc:   # `record` tries again, and fails as before
            if len(self.errors) < 100:
                self.errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
            return False

    def record(self, call_id, name, closed, args, refs, ns, source):
        """Run the probe program of one call and write it as a `probe:<name>` call;
        returns the probe's final outputs (for `check`), None when it could not run."""
        cap = self.capture
        try:
            self._device = one_device(args) if cap.digests is not None else None
            fn, mask, out_at, full_meta, after, fn_inside, calls = self._program(closed)
            calls[0] += 1
            if after[0] and calls[0] > digest_groups.INSIDE_AFTER_CALLS:
                # a long run: the program that digests inside, compiled once (its compile
                # costs less than the group programs' dispatches and copies over the calls
                # to come: on a TPU v5e ~31 s against ~27 ms a call, for a 4096-wide step)
                fn, after = fn_inside, (False,)
            res = fn(*args)
            outs, found = res[0], res[1]
            stats = iter(res[2]) if len(res) > 2 and mask is None else None
            digested = None
            if mask is not None:
                packed = res[2] if len(res) > 2 else None
                if after[0]:   # the values returned: digested now, by their groups
                    packed = _run_groups(cap.digests.groups, self._device, packed, found,
                                         mask, full_meta)
                digested = Digested(cap, mask, packed, found, full_meta)
        except Exception as exc:  # never break the script: the probe is extra work
            if len(self.errors) < 100:
                self.errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        self.calls += 1
        w = cap.session.writer
        pid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_CALL, op=f"probe:{name}",
                          origin=schema.ORIGIN_PROBE, name_stack=ns, source=source,
                          parent=call_id, step=cap.step,
                          params=f"{len(found)} equation outputs compiled as program outputs")
        for slot, r in enumerate(refs):
            w.add_input(pid, slot, *r)
        rest = iter(found)
        # rows reserved while the events are written are filled from one packed result:
        # no flush in between (writer.held); what is not digested in the program is hashed
        # as one program too
        with w.held(), cap._outputs():
            plan = self._plan_for(closed, ns, source, mask, digested, stats)
            if plan is not None:
                plan.run(cap, w, refs, pid, found, digested)
                self.equations += plan.n_events
            else:
                self._emit(closed, list(refs), pid, pid, ns, source, rest, stats, digested)
            if digested is not None and not digested.full:
                # the final outputs' rows from the program's own words (`Ref`s, also what
                # `check` compares with the compiled outputs); the others stored as before
                finals = []
                for slot, (x, i) in enumerate(zip(outs, out_at)):
                    if i is None:
                        ref = cap.store(pid, slot, x)
                        if ref is not None:
                            ref.array = x
                        finals.append(ref or x)
                    else:
                        ref = digested.ref(i, closed.jaxpr.outvars[slot].aval)
                        cap.digests.add_ref(pid, slot, ref, schema.ROLE_OUT)
                        ref.array = x   # for `check` where the compiled side has no Ref
                        finals.append(ref)
                digested.done()
                return finals
            if digested is not None:
                digested.done()
            finals = [digested.fetched_at(i, x) for x, i in zip(outs, out_at)] \
                if digested is not None else outs
            fetched = cap._fetch_at_full(finals)
            for slot, (v, h, kept) in enumerate(fetched):
                cap.store(pid, slot, v, h=h, kept=kept)
        if all(h is not None for _, h, _ in fetched):   # level full: `check` compares hashes
            return [digest_results.Fetched(v, h, kept) for v, h, kept in fetched]
        return outs

    def _plan_for(self, closed, ns, source, mask, digested, stats):
        """The `_Plan` of this call's events in this context, or None: the first call of a
        context runs `_emit` (and registers the program's constants), the second builds
        the plan, later ones reuse it. Only for values digested on the device (levels
        stats and full) with no --ops/--modules window (the steady state of a long run);
        never when TRACEDIFF_JAX_EMIT_PLAN=0 (the tests compare the two paths)."""
        cap = self.capture
        if digested is None or stats is not None or cap.filtered or not _PLANS_ON:
            return None
        w = cap.session.writer
        key = (id(closed), ns, source, cap._cur_device)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is closed and hit[1] is w:
            plan = hit[2]
            if plan is None or plan.mask != mask or not plan.valid(cap):
                plan = _Plan.build(cap, closed, ns, source, mask, w)
                self._plans[key] = (closed, w, plan)
            return plan
        if len(self._plans) > 256:
            self._plans.clear()
        self._plans[key] = (closed, w, None)   # built at the next call of this context
        return None

    def check(self, name, outs, compiled, compiled_refs=()):
        """Did the probe compute what the real program did? (counted in the manifest;
        compared on the device where values are hashed there: no bytes cross, and the
        answer is read at the next drain, `DeviceDigests.same_later`; by the words64 hashes
        already computed where both sides' are, `compare_later`: no program runs)"""
        digests = self.capture.digests
        if len(outs) != len(compiled):
            self._count(name, False)
        elif len(compiled_refs) == len(outs) and all(
                type(r) is digest_results.Fetched for r in (*outs, *compiled_refs)):
            # level full: both sides were hashed as they were fetched (no program runs)
            self._count(name, all(
                p.h == c.h and p.value.dtype == c.value.dtype and p.value.shape == c.value.shape
                for p, c in zip(outs, compiled_refs)))
        elif digests is not None:
            arrays = [x.array if type(x) is digest_results.Ref else x for x in outs]
            for x in outs:   # a Ref waiting for a drain keeps no array alive
                if type(x) is digest_results.Ref:
                    x.array = None
            if len(compiled_refs) == len(outs) and all(
                    type(r) is digest_results.Ref for r in (*outs, *compiled_refs)):
                digests.compare_later(list(outs), list(compiled_refs),
                                      lambda same: self._count(name, same))
            else:   # answered at the next drain: no host sync
                digests.same_later(arrays, compiled, lambda same: self._count(name, same))
        else:
            self._count(name, all(_same_bytes(p, c) for p, c in zip(outs, compiled)))

    def _count(self, name, same):
        if same:
            self.same_as_compiled += 1
        elif name not in self.differs_from_compiled:
            self.differs_from_compiled.append(name)

    def _emit(self, closed, refs, call_id, parent, prefix, source, rest, stats=None,
              digested=None):
        """One event per equation, values taken from the probe's outputs in walk order."""
        from jax.extend.core import Literal

        cap = self.capture
        jaxpr = closed.jaxpr
        env = {v: cap.producer(c, "constant") for v, c in zip(jaxpr.constvars, closed.consts)}
        env.update(zip(jaxpr.invars, refs))

        take = digested.take if digested is not None else None
        filtered, tags = cap.filtered, self.values_mode
        for eqn in jaxpr.eqns:
            site = cap.site(eqn)
            if site.mode == "skip":
                continue
            irefs = [(schema.PRODUCER_LITERAL, 0) if isinstance(v, Literal) else env[v]
                     for v in eqn.invars]
            eid, ns, src = cap.eqn_event(site, irefs, prefix, source, call_id, parent, -1,
                                          schema.ORIGIN_PROBE)
            self.equations += 1
            if site.mode == "call":
                self._emit(site.sub, irefs, call_id, eid, ns, src, rest, stats, digested)
            keep = not filtered or cap.opts.selected(site.op, ns)
            for slot, v in enumerate(eqn.outvars):
                x = next(rest)
                st = next(stats) if stats is not None else None
                got = take(eid, slot, v, x, keep) if take is not None else False
                if not got:
                    cap.store(eid, slot, x, store=keep,
                              stats=None if st is None else xla_stats.finish(st))
                if tags and site.tag is not None:   # digested here: the step's row takes
                    cap._pending_optim[site.tag] = got if type(got) in (    # its words or
                        digest_results.Ref, digest_results.Fetched) else cap.optim_value(x)  # bytes
                if type(v).__name__ != "DropVar":
                    env[v] = (eid, slot)


def _same_bytes(x, y):
    dtype = getattr(x, "dtype", None)
    if dtype is not None and internals.is_key_dtype(dtype):
        import jax

        x, y = jax.random.key_data(x), jax.random.key_data(y)
    try:
        x, y = np.asarray(x), np.asarray(y)
    except Exception:   # tokens: nothing to compare
        return True
    return x.dtype == y.dtype and x.shape == y.shape and values.same_bytes(x, y)


def _traced_full(groups, device, outs, found, mask, at, out_at, full_meta, after, inside):
    """Traced, level full: a values program's outputs (`Prober._program`): the small values
    joined into one buffer (one copy to the host), hashed by group programs after it
    (`after`, then joined by a program of their own: `DigestGroups.prepare_join`) or in it
    (`fetch_parts`), from the values as an optimization barrier hands them on: XLA may not
    recompute a value in a hashing or joining fusion with other rounding (an FMA
    contracted in one fusion, not the other, seen on XLA:CPU). Fills `full_meta`'s lists
    and `out_at` (per final output: its value's place among the digested ones)."""
    import jax

    avals, nbytes, starts, joiner = full_meta
    out_at[:] = [at.get(id(x)) for x in outs]
    kept = [x for x, m in zip(found, mask) if m]
    avals[:] = [(x.shape, x.dtype) for x in kept]
    nbytes[:] = [x.size * np.dtype(x.dtype).itemsize for x in kept]
    small = digest_results.joined(avals)
    starts[:] = digest_results.joined_starts(avals, small)
    if kept:
        kept = list(jax.lax.optimization_barrier(kept))
    if not inside:   # (the variant that hashes inside leaves the choice as is)
        after[0] = groups is not None and groups.accepts(kept, device, with_stats=False)
        alone = [x for x, j in zip(kept, small) if j]
        joiner[0] = groups.prepare_join(alone, device) if after[0] and alone else None
    back = iter(None if j else x for x, j in zip(kept, small))
    return outs, [next(back) if m else x for x, m in zip(found, mask)], \
        _joined_parts(kept, small, after[0] and not inside)


def _joined_parts(kept, small, after):
    """Traced, level full: what a values program returns beside its values: the small ones
    (to be joined by a program of their own and hashed by group programs after it:
    `after`), else their lanes and the joined buffer (`fetch_parts`)."""
    if not after:
        return digest_programs.fetch_parts(kept, small)
    return [x for x, j in zip(kept, small) if j], None


def _run_groups(groups, device, packed, found, mask, full_meta):
    """The group programs' results for a values program's returned values: `run`'s (outputs,
    take); at level full with the small ones' joined buffer (`DigestGroups.join`), the
    values in order taken from the large ones (`found`) and the small ones (`packed[0]`,
    their starts not None)."""
    if full_meta is None:
        return groups.run(packed, device)
    small = packed[0]
    flat = groups.join(full_meta[3][0], small) if small else None
    alone, joined = iter(x for x, m in zip(found, mask) if m), iter(small)
    xs = []
    for at in full_meta[2]:
        x = next(alone)
        xs.append(x if at is None else next(joined))
    return groups.run(xs, device, with_stats=False), flat


def _is_tag(site, eqn):
    return site.op == "name" and str(eqn.params.get("name", "")).startswith(OPTAX_TAG)


class _NoPlan(Exception):
    """A call whose events cannot be planned (a constant not registered yet)."""


class _Plan:
    """The events and rows `Prober._emit` writes for one values program in one context
    (name stack, source, device), made once: per call only the event ids (consecutive
    from the first: nothing else writes an event inside `writer.held()`), the call's id,
    the step, the producers of the call's arguments and the values that are not digested
    change. A train step's ~190 equation events then cost a few list operations each
    instead of ~25 us of Python (name stacks, interning, dict lookups, objects)."""

    __slots__ = ("closed", "mask", "heads", "devices", "inputs", "ops", "consts", "n_events",
                 "n_rows", "has_store")

    @classmethod
    def build(cls, cap, closed, ns, source, mask, w):
        """Walk the jaxpr as `_emit` does, writing nothing; None when a constant has no
        registered producer yet (`_emit` makes its input event)."""
        from jax.extend.core import Literal

        self = cls()
        self.closed, self.mask = closed, list(mask)
        self.heads, self.devices, self.inputs, self.ops, self.consts = [], [], [], [], []
        reserve_ids = cap.digests.ids_of
        state = {"fi": 0, "at": 0}
        dev = cap._cur_device
        lit = (0, schema.PRODUCER_LITERAL, 0)

        def walk(closed, in_specs, parent, prefix, src0):
            jaxpr = closed.jaxpr
            env = {}
            for v, c in zip(jaxpr.constvars, closed.consts):
                ref = cap.registered(c)
                if ref is None:
                    raise _NoPlan
                self.consts.append((c, ref))
                env[v] = (0, *ref)
            env.update(zip(jaxpr.invars, in_specs))
            for eqn in jaxpr.eqns:
                site = cap.site(eqn)
                if site.mode == "skip":
                    continue
                specs = [lit if isinstance(v, Literal) else env[v] for v in eqn.invars]
                head, ns_, src, dev_id, lits = cap.site_entry(site, prefix, src0,
                                                              schema.ORIGIN_PROBE, dev, w)
                k = len(self.heads)
                self.heads.append((head, parent))
                if dev_id >= 0:
                    self.devices.append((k, dev_id))
                self.inputs.extend((k, slot, *spec) for slot, spec in enumerate(specs))
                for slot, hv in lits:
                    self.ops.append((0, k, slot, hv))
                if site.mode == "call":
                    walk(site.sub, specs, k, ns_, src)
                for slot, v in enumerate(eqn.outvars):
                    i = state["fi"]
                    state["fi"] += 1
                    if self.mask[i]:
                        aval = v.aval
                        ids, nbytes = reserve_ids(aval)
                        self.ops.append((1, k, slot, (schema.ROLE_OUT, 0, *ids, -1, -1, 0, 0),
                                         nbytes, site.tag, state["at"], aval.dtype,
                                         tuple(aval.shape), ids, i))
                        state["at"] += 1
                    else:
                        self.ops.append((2, k, slot, i, site.tag))
                    if type(v).__name__ != "DropVar":
                        env[v] = (1, k, slot)

        try:
            walk(closed, [(2, j, 0) for j in range(len(closed.jaxpr.invars))], -1, ns, source)
        except _NoPlan:
            return None
        self.n_events = len(self.heads)
        self.has_store = any(op[0] == 2 for op in self.ops)
        return self

    def valid(self, cap):
        """The program's constants still have the producers the plan refers to."""
        return all(cap.registered(c) == ref for c, ref in self.consts)

    def run(self, cap, w, refs, pid, found, digested):
        """Write the call's events, inputs and rows (what `_emit` writes, in its order)."""
        if w.before_event is not None:
            w.before_event()
        rows = w._rows
        base = w.n_events
        step = cap.step
        rows["events"].extend([head + (pid, pid if parent < 0 else base + parent, step, -1)
                               for head, parent in self.heads])
        if self.devices:
            rows["devices"].extend([(base + k, d) for k, d in self.devices])
        rows["inputs"].extend([
            (base + k, slot, a, b) if kind == 0 else
            (base + k, slot, base + a, b) if kind == 1 else (base + k, slot, *refs[a])
            for k, slot, kind, a, b in self.inputs])
        values_rows = rows["values"]
        held = digested.rows
        result = digested.result
        optim = cap._pending_optim
        hashes = digested.hashes if digested.full else None
        # level full: the joined values' bytes go to the trace as the one buffer they came
        # back in, each row pointing into it (no copy a value)
        at = digested.kept_at = w.keep_joined(digested.joined) \
            if hashes is not None else None
        starts = digested.starts if hashes is not None else None
        for op in self.ops:
            kind = op[0]
            if hashes is not None and kind == 1:   # level full: hashed and fetched
                i, event = op[6], base + op[1]
                h = hashes[i]
                if at is not None and starts[i] is not None:
                    w.add_fetched_row(event, op[2], op[9], at + starts[i], op[4], h)
                    if op[5] is not None:   # the step's row points at the same bytes
                        optim[op[5]] = digest_results.Fetched(digested.host(i), h, at + starts[i])
                    continue
                if starts[i] is None:   # too large to join: held as it came back, no copy
                    x = found[op[10]]
                    off = w.keep_joined(digest_results.Joined(x, copy=False))   # copy under way
                    if off is not None:
                        digested.kept_alone[i] = off
                        w.add_fetched_row(event, op[2], op[9], off, op[4], h)
                        if op[5] is not None:
                            optim[op[5]] = digest_results.Fetched(x, h, off)
                        continue
                host = digested.host(i)
                host = None if host is None else np.asarray(host)   # to be copied: read now
                if host is None or not w.add_fetched(event, op[2], op[9], host, op[4], h):
                    host = found[op[10]] if host is None else host
                    cap.store(event, op[2], host, h=h)
                if op[5] is not None:
                    optim[op[5]] = digest_results.Fetched(host, h)
            elif kind == 1:       # digested in the program: a reserved row
                values_rows.append((base + op[1], op[2]) + op[3])
                held.append((len(values_rows) - 1, op[4]))
                if op[5] is not None:
                    optim[op[5]] = digest_results.Ref(result, op[6], op[7], op[8], op[4])
            elif kind == 0:     # a literal input
                w.add_host_value(base + op[1], op[2], op[3], role=schema.ROLE_IN)
            else:               # returned by the program: stored as `_emit` stores it
                x = found[op[3]]
                cap.store(base + op[1], op[2], x)
                if op[4] is not None:
                    optim[op[4]] = cap.optim_value(x)
        digested.at = len(held)
        w.after_rows()
