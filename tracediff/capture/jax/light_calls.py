"""A jit call recorded by its inputs and outputs only: `--level calls`, and every call
outside a `--steps` window (where only optimizer steps are counted).

No replay and no eager primitives: the compiled call runs as the script called it,
through the hook or around JAX's C++ fast path (fastjit.py), and its arguments and
outputs are written (hash and statistics). What does not change from one call to the
next is made once per jitted function and signature (`_LightPlan`).
"""

import numpy as np

from ...trace import schema
from . import digest_results
from .dispatch import this_thread


class _LightPlan:
    """The rows of a recorded call made once per jitted function and signature, where
    `record_light_call` wrote them value by value at every call (~5 us a value, 20-40
    values a training step's call): its arguments' rows for when each was recorded
    already (name, dtype and shape only; `in_rows`), and its outputs' string ids and byte
    counts for rows hashed on the device (`out_ids`, `out_nbytes`; None where a dtype is
    not hashed there)."""

    __slots__ = ("jaxpr", "in_rows", "out_ids", "out_nbytes")

    def __init__(self, closed, writer, digests, arg_names, result_names):
        self.jaxpr = closed
        self.in_rows = self.out_ids = self.out_nbytes = None
        ins, outs = closed.in_avals, closed.out_avals
        if not all(hasattr(a, "dtype") and hasattr(a, "shape") for a in (*ins, *outs)):
            return
        names = arg_names(closed, len(ins))
        self.in_rows = [writer.meta_row(slot, str(a.dtype), a.shape, schema.ROLE_IN,
                                        names[slot]) for slot, a in enumerate(ins)]
        if digests is None or not all(digest_results.dtype_ok(a.dtype) for a in outs):
            return
        names = result_names(closed, len(outs))
        made = [digests.ids_of(a) for a in outs]
        self.out_ids = [(ids, writer.intern(name)) for (ids, _), name in zip(made, names)]
        self.out_nbytes = [n for _, n in made]


class _LightCalls:
    """JaxCapture's calls recorded by inputs and outputs (`record_light_call`)."""

    def record_light_call(self, name, jaxpr, args, run):
        """`_call_light`'s recording of one call: `args` its flat inputs, `run()` runs it
        and returns its flat outputs (the hook's compiled call, or a `FastJit`'s)."""
        if not self._decided:
            self._decide()
        record = self._in_window()
        this_thread.suppress += 1
        try:
            with self.session.lock:
                if self._pending_optim and not this_thread.optax_depth:  # eager optax tags since the
                    self.flush_optim()                              # last call
                call_id = None
                if record:
                    self.calls += 1
                    w = self.session.writer
                    call_id = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_CALL,
                                          op=f"jit:{name}",
                                          origin=schema.ORIGIN_COMPILED,
                                          name_stack=self._name_stack(),
                                          source=self._live_source(), step=self.step,
                                          params=f"{len(jaxpr.jaxpr.eqns)} eqns")
                    plan = self._light_plan(jaxpr)
                    refs = [self._known_producer(x) for x in args]
                    w.add_inputs(call_id, refs)
                    if plan.in_rows is not None and not self.filtered and \
                            all(r[0] >= 0 for r in refs):
                        w.add_meta_rows(call_id, plan.in_rows)   # all recorded already
                    else:
                        names = self._arg_names(jaxpr, len(args))
                        for slot, (x, ref) in enumerate(zip(args, refs)):
                            self.store(call_id, slot, x, name=names[slot],
                                       role=schema.ROLE_IN, store=self._arg_needs_bytes(ref))
                if self.digests is not None:   # before the call may donate its arguments
                    self.digests.dispatch()
                    if record:
                        self._prepare_outputs(jaxpr, args)
                outs = run()
                if record:
                    if plan.out_ids is not None and self.digests is not None and \
                            w.level != "full" and all(map(digest_results.can_digest, outs)):
                        self.digests.add_rows(outs, w.reserve_rows(call_id, schema.ROLE_OUT,
                                                                   plan.out_ids),
                                              plan.out_nbytes)
                        for slot, x in enumerate(outs):
                            self._register(x, call_id, slot)
                    else:
                        names = self._result_names(jaxpr, len(outs))
                        fetched = self._fetch_at_full(outs)
                        with self._outputs():
                            for slot, (x, (v, h, _)) in enumerate(zip(outs, fetched)):
                                self.store(call_id, slot, v, name=names[slot], h=h)
                                self._register(x, call_id, slot)
                    if self.digests is not None:
                        self.digests.dispatch()
                if self._has_optax(jaxpr):
                    self.step += 1
        finally:
            this_thread.suppress -= 1

    def _light_plan(self, closed):
        """A jitted function's rows made once per signature (`_LightPlan`, cached by its
        closed jaxpr)."""
        hit = self._light_plans.get(id(closed))
        if hit is not None and hit.jaxpr is closed:
            return hit
        if len(self._light_plans) > 1024:   # a script whose shapes change every step: its
            self._light_plans.clear()        # jaxprs (constants too) are not kept forever
        plan = self._light_plans[id(closed)] = _LightPlan(
            closed, self.session.writer, self.digests, self._arg_names, self._result_names)
        return plan

    def _known_producer(self, x):
        """(event, slot) of a recorded array, else unknown (no input snapshot event)."""
        entry = self._producers.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1], entry[2]
        if isinstance(x, (int, float, complex, bool, np.generic)):
            return schema.PRODUCER_LITERAL, 0
        return schema.PRODUCER_UNKNOWN, 0
