"""The jaxpr interpreter: a recorded jit call replayed equation by equation.

A small interpreter in the style of `jax.core.eval_jaxpr` runs the call's jaxpr from its
real inputs and writes every equation's event and outputs (origin replay): nested calls
and `cond` branches are entered, `scan`/`while` stepped one iteration at a time under
`--loops stepped`, `shard_map` bodies replayed per device (devices.py). Nothing replayed
is returned to the script; how far replay's numbers are from the compiled program's is
measured per call (`_measure_replay`) for the manifest.
"""

import numpy as np

from ...trace import schema, values
from . import internals
from .optax_tags import OPTAX_TAG
from .sites import Site


class _Replay:
    """JaxCapture's replay of a call's equations and the events they write."""

    def _replay_call(self, call_id, closed, args, host=False):
        if internals.repeats_side_effects(closed):
            self.opaque_calls += 1
            return
        try:
            if host:   # on the host CPU (host_replay): never op by op on the accelerator
                args = self.host.inputs(args)
                if args is None:
                    self.opaque_calls += 1
                    return None
                import jax

                with jax.default_device(self.host.device()):
                    return self._interpret(closed, list(args), list(self._call_refs), call_id,
                                           call_id, self._call_ns, -1, self._call_source)[0]
            return self._interpret(closed, list(args), list(self._call_refs), call_id, call_id,
                                   self._call_ns, -1, self._call_source)[0]
        except Exception as exc:  # never break the script: the compiled call still runs
            if len(self.replay_errors) < 100:
                self.replay_errors.append(f"call {call_id}: {type(exc).__name__}: {str(exc)[:200]}")
            return None

    def _measure_replay(self, name, replayed, compiled):
        """How faithful is replay here? Compare the replayed outputs of a call with its
        compiled outputs (what the script got), after both were written (their hashes
        say which are the same bytes); the totals go into the manifest. Whether they
        differ is known for every call; by how much (`max_rel_difference`, a pass over
        a train step's whole state) for the calls `measured_call` picks."""
        if replayed is None or len(replayed) != len(compiled):
            return
        worst = 0.0
        differs = measure = False
        for r, c in zip(replayed, compiled):
            hr, hc = self._known_hash(r), self._known_hash(c)
            try:
                r, c = np.asarray(r), np.asarray(c)
            except Exception:  # PRNG keys, tokens: not numbers to compare
                continue
            if r.shape != c.shape or r.dtype != c.dtype:
                continue
            same = hr == hc if hr is not None and hc is not None else values.same_bytes(r, c)
            if same:
                continue
            if not differs:   # this call's first differing output: is it one measured?
                seen = self._differing_calls[name] = self._differing_calls.get(name, 0) + 1
                measure = measured_call(seen)
            differs = True
            if measure and r.dtype.kind in "fc" and r.size:
                worst = max(worst, _max_rel_difference(r, c))
        fid = self.fidelity
        fid["calls_compared"] += 1
        if differs:
            fid["calls_where_replay_differs"] += 1
            if measure:
                fid["calls_measured"] += 1
                fid["max_rel_difference"] = max(fid["max_rel_difference"], worst)
            if len(fid["examples"]) < 5 and name not in fid["examples"]:
                fid["examples"].append(name)

    def _known_hash(self, x):
        """The hash this call wrote for array x (`_remember_hash`), else None: where both
        sides of `_measure_replay` have one, equal bytes are equal hashes, and a train
        step's outputs (its parameters and optimizer state) are not compared byte by
        byte a second time (~3 % of a JAX MLP step recorded at stats on the CPU)."""
        hit = self._hashed.get(id(x))
        return hit[1] if hit is not None and hit[0]() is x else None

    def site(self, eqn):
        site = self._sites.get(id(eqn))
        if site is None or site.eqn is not eqn:
            site = self._sites[id(eqn)] = Site(eqn, self.session)
        return site

    def _drops(self, jaxpr):
        """The variables each equation of `jaxpr` reads or writes for the last time (cached
        per jaxpr): `_interpret` lets go of them at once, so XLA reuses their buffers.
        Kept until the call's end, a train step's ~120 MB of intermediates landed in fresh
        pages every step (the allocator hands them back at the end), and first touches of
        fresh pages cost as much as the op-by-op replay itself (issue 55)."""
        hit = self._drop_plans.get(id(jaxpr))
        if hit is None or hit[0] is not jaxpr:
            hit = self._drop_plans[id(jaxpr)] = (jaxpr, _drop_plan(jaxpr))
        return hit[1]

    def _interpret(self, closed, vals, refs, call_id, parent, prefix, it, source):
        from jax.extend.core import Literal

        jaxpr = closed.jaxpr
        drops = self._drops(jaxpr)
        env = {}
        for v, c in zip(jaxpr.constvars, closed.consts):
            env[v] = (c, self.producer(c, "constant"))
        for v, x, r in zip(jaxpr.invars, vals, refs):
            env[v] = (x, r)

        def read(v):
            if isinstance(v, Literal):
                return v.val, (schema.PRODUCER_LITERAL, 0)
            return env[v]

        for eqn, drop in zip(jaxpr.eqns, drops):
            site = self.site(eqn)
            if site.mode == "skip":
                continue
            ins = [read(v) for v in eqn.invars]
            ivals = [a for a, _ in ins]
            irefs = [r for _, r in ins]
            eid, ns, src = self.eqn_event(site, irefs, prefix, source, call_id, parent, it,
                                           schema.ORIGIN_REPLAY)
            self.eqns += 1
            mode = site.mode
            if mode == "call":
                outs, _ = self._interpret(site.sub, ivals, irefs, call_id, eid, ns, it, src)
            elif mode == "cond":
                branch = eqn.params["branches"][int(np.asarray(ivals[0]))]
                outs, _ = self._interpret(branch, ivals[1:], irefs[1:], call_id, eid, ns, it, src)
            elif mode == "scan" and self.stepped:
                outs = self._step_scan(eqn, ivals, irefs, call_id, eid, ns, src)
            elif mode == "while" and self.stepped:
                outs = self._step_while(eqn, ivals, irefs, call_id, eid, ns, src)
            elif mode == "shard_map" and self.per_device:
                outs = self.bodies.replay(eqn, ivals, irefs, call_id, eid, ns, it, src)
            else:
                outs = self.bind(eqn, ivals)
            keep = not self.filtered or self.opts.selected(site.op, ns)
            for slot, (v, x) in enumerate(zip(eqn.outvars, outs)):
                self.store(eid, slot, x, store=keep)
                if site.op == "name" and str(eqn.params.get("name", "")).startswith(OPTAX_TAG):
                    self._pending_optim[eqn.params["name"][len(OPTAX_TAG):]] = self.optim_value(
                        x, replayed=True)
                if type(v).__name__ != "DropVar":
                    env[v] = (x, (eid, slot))
            for v in drop:
                env.pop(v, None)
            del ins, ivals, outs
        return [read(v)[0] for v in jaxpr.outvars], [read(v)[1] for v in jaxpr.outvars]

    def eqn_event(self, site, irefs, prefix, source, call_id, parent, it, origin, device=None):
        """Write the event of one equation (replayed or probed, on one `device` of a
        shard_map body or none) and its input links; returns (event id, name stack, source).

        What does not change from one step to the next (the row's interned strings, the
        name stack, the source, the literals prepared and hashed) is made once per site,
        call context and writer (`_site_rows`): ~300 equation events a step of a train
        step paid their strings, dicts and numpy work again every step."""
        w = self.session.writer
        dev = device or self._cur_device
        head, ns, src, dev_id, lits = self.site_entry(site, prefix, source, origin, dev, w)
        eid = w.add_event_row(head, call_id, parent, self.step, it, dev_id)
        if irefs:
            w.add_inputs(eid, irefs)
        for slot, hv in lits:
            w.add_host_value(eid, slot, hv, role=schema.ROLE_IN)
        return eid, ns, src

    def site_entry(self, site, prefix, source, origin, dev, w):
        """The constant parts of `eqn_event`'s event for this site in this context (made
        once per writer, `_site_rows`)."""
        if site.rows_writer is not w or len(site.rows) > 64:   # bounded: a site called from
            site.rows, site.rows_writer = {}, w                # many contexts stays correct
        ent = site.rows.get((prefix, source, origin, dev))
        if ent is None:
            ent = self._site_rows(site, prefix, source, origin, dev, w)
        return ent

    def _site_rows(self, site, prefix, source, origin, dev, w):
        """(event row head, name stack, source, device id, literals) of an equation's
        events in one call context: `eqn_event`'s constant parts."""
        ns = f"{prefix}/{site.name_stack}" if prefix and site.name_stack else (prefix or site.name_stack)
        src = site.source or source
        head = w.event_head(schema.FW_JAX, schema.KIND_EQN, schema.PHASE_FWD, origin, site.op,
                            site.params, ns, src)
        dev_id = w.intern(dev) if dev else -1
        lits = [(slot, w.host_value(val)) for slot, val in site.literals]
        ent = site.rows[(prefix, source, origin, dev)] = (head, ns, src, dev_id, lits)
        return ent

    @staticmethod
    def bind(eqn, vals):
        prim = eqn.primitive
        with eqn.ctx.manager:
            out = prim.bind(*vals, **internals.bind_params(prim, eqn.params))
        return list(out) if prim.multiple_results else [out]

    def _step_scan(self, eqn, vals, refs, call_id, parent, ns, src):
        import jax.numpy as jnp

        p = eqn.params
        nc, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
        consts, carry, xs = vals[:nc], vals[nc:nc + ncarry], vals[nc + ncarry:]
        crefs, carry_refs, xrefs = refs[:nc], refs[nc:nc + ncarry], refs[nc + ncarry:]
        ys = []
        order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
        for i in order:
            x_i = [x[i] for x in xs]
            outs, orefs = self._interpret(p["jaxpr"], [*consts, *carry, *x_i],
                                          [*crefs, *carry_refs, *xrefs], call_id, parent, ns, i, src)
            carry, carry_refs = outs[:ncarry], orefs[:ncarry]
            ys.append(outs[ncarry:])
        if p.get("reverse"):
            ys.reverse()
        n_ys = len(eqn.outvars) - ncarry
        stacked = [jnp.stack([y[k] for y in ys]) if ys else self.bind(eqn, vals)[ncarry + k]
                   for k in range(n_ys)]
        return [*carry, *stacked]

    def _step_while(self, eqn, vals, refs, call_id, parent, ns, src):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
        crefs, brefs, carry_refs = refs[:cn], refs[cn:cn + bn], refs[cn + bn:]
        i = 0
        while True:
            (pred,), _ = self._interpret(p["cond_jaxpr"], [*cconsts, *carry], [*crefs, *carry_refs],
                                         call_id, parent, ns, i, src)
            if not bool(np.asarray(pred)):
                return carry
            carry, carry_refs = self._interpret(p["body_jaxpr"], [*bconsts, *carry],
                                                [*brefs, *carry_refs], call_id, parent, ns, i, src)
            i += 1


MEASURED_FIRST = 8


def measured_call(k):
    """Is the k-th differing call of a jitted function (1-based) one whose difference is
    measured? Its first `MEASURED_FIRST`, then the 16th, 32nd, 64th...: the difference's
    size was ~10 % of a JAX MLP step recorded at stats on the CPU (issue 55), and it
    follows the program (which equations XLA fused) more than the step; whether each
    call differs stays known for every call (`calls_where_replay_differs`), and the
    manifest says over how many calls the size was taken (`calls_measured`)."""
    return k <= MEASURED_FIRST or k & (k - 1) == 0


def _drop_plan(jaxpr):
    """[variables to let go of after equation i] of a jaxpr: those it reads for the last
    time and its outputs no later equation reads, never the jaxpr's own outputs."""
    from jax.extend.core import Literal

    last = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in (*eqn.invars, *eqn.outvars):
            if not isinstance(v, Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last.pop(v, None)
    plan = [[] for _ in jaxpr.eqns]
    for v, i in last.items():
        plan[i].append(v)
    return [tuple(p) for p in plan]


def _max_rel_difference(r, c, chunk=1 << 15):
    """max |r - c| / max(|c|, tiny) over the arrays, NaNs ignored (0.0 if every one is
    NaN): the difference in float64 (complex128 for complex values), |c| in c's own
    dtype, the same numbers as one complex128 pass over everything. A few differing
    elements (XLA fused one op): those alone; many: cache-sized chunks, so the wide
    temporaries are never a fresh array as large as the outputs (a train step's are its
    parameters and optimizer state, every call)."""
    wide = np.complex128 if r.dtype.kind == "c" else np.float64
    tiny = np.finfo(r.dtype).tiny
    at = None
    if r.dtype == np.float32 and r.size >= chunk and r.flags.c_contiguous and c.flags.c_contiguous:
        rf, cf = r.reshape(-1), c.reshape(-1)
        at = _float32_candidates(rf, cf, chunk)
    with np.errstate(all="ignore"):
        if at is not None:   # the few elements whose quotient may be the largest
            parts = [(rf[at], cf[at])]
        else:
            differ = r != c  # equal elements add 0 (or NaN: inf - inf), never the maximum
            n = int(np.count_nonzero(differ))
            if n == 0:
                return 0.0   # only the bytes differ (-0.0 and 0.0, NaN payloads)
            if n * 8 < differ.size:
                parts = [(r[differ], c[differ])]
            else:
                rf, cf = r.reshape(-1), c.reshape(-1)
                parts = ((rf[i:i + chunk], cf[i:i + chunk]) for i in range(0, rf.size, chunk))
        worst = np.nan
        for rs, cs in parts:
            rel = np.abs(rs.astype(wide) - cs) / np.maximum(np.abs(cs), tiny)
            worst = np.fmax(worst, np.fmax.reduce(rel))
    return float(worst) if worst == worst else 0.0


def _float32_candidates(rf, cf, chunk):
    """Indices of the elements whose float64 relative difference may be the largest of two
    float32 arrays (`_max_rel_difference`), found by the same quotient in float32 over
    cache-sized chunks: ~4x cheaper than the float64 pass (a train step's outputs, every
    call) and exact, since the float32 quotient is within 2^-23 of the float64 one when
    nothing overflows or underflows. None where something might (the largest float32
    quotient infinite, NaN or under 2^-100): the float64 pass decides."""
    tiny = np.finfo(np.float32).tiny
    d, a = np.empty(chunk, np.float32), np.empty(chunk, np.float32)

    def quotients(i):
        rs, cs = rf[i:i + chunk], cf[i:i + chunk]
        dd, aa = d[:rs.size], a[:rs.size]
        np.subtract(rs, cs, out=dd)
        np.abs(dd, out=dd)
        np.abs(cs, out=aa)
        np.maximum(aa, tiny, out=aa)
        return np.divide(dd, aa, out=dd)

    with np.errstate(all="ignore"):
        peaks = np.array([np.fmax.reduce(quotients(i)) for i in range(0, rf.size, chunk)])
        peak = np.fmax.reduce(peaks)
        if not 2.0 ** -100 <= peak < np.inf:
            return None
        floor = np.float32(peak * (1 - 2.0 ** -20))   # below any element within 2^-22 of it
        return np.concatenate([np.flatnonzero(quotients(i) >= floor) + i
                               for i in np.flatnonzero(peaks >= floor) * chunk])
