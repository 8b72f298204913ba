"""The hooks JAX calls while the script runs: every concrete jit call and every eager
primitive, and which of them tracediff records.

`pjit._pjit_call_impl_python` sees every concrete jit call (`_impl_hook`): the call is
recorded (its arguments, its equations' values by replay or a values program, then the
compiled outputs the script receives), or only by its inputs and outputs at `--level
calls` and outside a `--steps` window (light_calls.py); `_get_fastpath_data` returns None
for a recorded call so that C++ dispatch does not hide calls 2..N; `EvalTrace.
process_primitive` sees eager primitives (`_record_eager`). What tracediff itself runs in
JAX is never recorded (`this_thread.suppress`, `_quiet`).
"""

import contextlib
import threading

from ...trace import schema
from . import devices, digest_results, internals
from .optax_tags import OPTAX_TAG
from .sites import summarize_params


class _Local(threading.local):
    """What this thread is doing, for the hooks (read by every part of the capture)."""

    suppress = 0        # >0 while tracediff itself is running JAX code
    intercepted = False  # the last jit call was recorded: deny it the C++ fast path
    optax_depth = 0


this_thread = _Local()


class _Dispatch:
    """JaxCapture's hooks and the events of a call's start and of an eager primitive."""

    @staticmethod
    @contextlib.contextmanager
    def _quiet():
        this_thread.suppress += 1
        try:
            yield
        finally:
            this_thread.suppress -= 1

    @staticmethod
    def own_work():
        """Is tracediff's own JAX work running (nothing of it is recorded)?"""
        return this_thread.suppress > 0

    def _fast_hook(self, *args, **kwargs):
        if this_thread.intercepted:
            this_thread.intercepted = False
            return None
        return self._orig["fast"](*args, **kwargs)

    def _impl_hook(self, *args, jaxpr, **params):
        orig = self._orig["impl"]
        if this_thread.suppress or not self.session.active or not self._core.trace_state_clean():
            return orig(*args, jaxpr=jaxpr, **params)
        if not self._decided:
            self._decide()
        if self.calls_only or not self._in_window():
            return self._call_light(orig, args, jaxpr, params)
        this_thread.suppress += 1  # everything below is tracediff's own JAX work: never recorded
        try:
            with self.session.lock:
                call_id = self._record_call_start(params.get("name", "?"), jaxpr, args)
                self._prepare_outputs(jaxpr, args)
                name = params.get("name", "?")
                replayed = valued = None
                host = self.host.wants(jaxpr)   # float64/complex128 on an accelerator
                self._call_donated = {id(x) for x, d in zip(args, params.get("donated_invars", ()))
                                      if d}
                self._hashed = {}
                values = self.values_prober is not None and not host and not (
                    self.prober is not None and self.prober.wants(name)) and \
                    not internals.repeats_side_effects(jaxpr)   # replay: not replayed either
                # a program's first call that donates nothing: the script's program runs
                # (and compiles) first, while its values program compiles in the background
                first = values and not self._call_donated and \
                    self.values_prober.start(name, jaxpr, args)
                if first:
                    result = orig(*args, jaxpr=jaxpr, **params)
                if values:
                    valued = self.values_prober.record(call_id, name, jaxpr, args, self._call_refs,
                                                       self._call_ns, self._call_source)
                if valued is None:  # replay mode, a --probe'd call, or the program failed
                    replayed = self._replay_call(call_id, jaxpr, args, host)
                probed = None
                if self.prober is not None and self.prober.wants(name) and replayed is not None \
                        and not host:
                    # before the real call, which may donate (delete) its arguments
                    probed = self.prober.record(call_id, name, jaxpr, args, self._call_refs,
                                                self._call_ns, self._call_source)
                self._cur_device = None
                if self.digests is not None:   # before the call may donate its arguments
                    self.digests.dispatch()
                if not first:
                    result = orig(*args, jaxpr=jaxpr, **params)
                outs = internals.call_outputs(result)
                if probed is not None:
                    self.prober.check(name, probed, outs)
                names = self._result_names(jaxpr, len(outs))
                fetched = self._fetch_at_full(outs, same_as=valued)
                with self._outputs():
                    refs = [self.store(call_id, slot, v, name=names[slot], h=h, kept=kept)
                            for slot, (v, h, kept) in enumerate(fetched)]
                    for slot, x in enumerate(outs):
                        self._register(x, call_id, slot)
                if not host:
                    self._measure_replay(name, replayed, outs)
                if valued is not None:   # by the hashes of both sides where they were made
                    if all(h is not None for _, h, _ in fetched):   # level full: as fetched
                        refs = [digest_results.Fetched(v, h) for v, h, _ in fetched]
                    self.values_prober.check(name, valued, outs, refs)
                if not this_thread.optax_depth:  # a jit call inside an eager optax update is not its end
                    self.flush_optim()
                if self.digests is not None:
                    self.digests.dispatch()
        finally:
            this_thread.suppress -= 1
        this_thread.intercepted = True
        return result

    def _in_window(self):
        o = self.opts
        return o.in_steps(self.step) if hasattr(o, "in_steps") else True

    def _call_light(self, orig, args, jaxpr, params):
        """`--level calls` (and calls outside a --steps window): run the compiled call
        as is; record it (inputs and outputs, hash + stats) only when its step is in the
        window; count it as an optimizer step when its jaxpr holds optax tags."""
        result = []

        def run():
            result.append(orig(*args, jaxpr=jaxpr, **params))
            return internals.call_outputs(result[0])

        self.record_light_call(params.get("name", "?"), jaxpr, args, run)
        this_thread.intercepted = True
        return result[0]

    def records_fast_calls(self):
        """Is a `fastjit.FastJit` call to be recorded now (a concrete call of the
        script's, not tracediff's own JAX work)?"""
        return not self.own_work() and self.session is not None and self.session.active and \
            self._core.trace_state_clean()

    def _make_pp_hook(self):
        capture, orig = self, self._orig["pp"]
        jit_names = internals.JIT_NAMES

        def process_primitive(trace, prim, args, params, /):
            if this_thread.suppress or prim.name in jit_names or not capture.session.active:
                return orig(trace, prim, args, params)
            if capture.calls_only or not capture._in_window():
                # not recorded: only an eager optax step is counted (at the next call)
                if prim.name == "name" and str(params.get("name", "")).startswith(OPTAX_TAG):
                    capture._pending_optim[params["name"][len(OPTAX_TAG):]] = None
                this_thread.suppress += 1  # an eager primitive's own jit dispatch is not a call
                try:
                    return orig(trace, prim, args, params)
                finally:
                    this_thread.suppress -= 1
            this_thread.suppress += 1
            try:
                out = orig(trace, prim, args, params)
                if not capture._decided:
                    capture._decide()
                with capture.session.lock:
                    capture._record_eager(prim, params, args, out)
            finally:
                this_thread.suppress -= 1
            return out

        return process_primitive

    def _record_call_start(self, name, jaxpr, args):
        self.calls += 1
        w = self.session.writer
        source = self._live_source()
        refs = [self.producer(x, "argument") for x in args]
        ns = self._name_stack()
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_CALL, op=f"jit:{name}",
                          origin=schema.ORIGIN_COMPILED, name_stack=ns,
                          source=source, step=self.step,
                          params=f"{len(jaxpr.jaxpr.eqns)} eqns")
        # a call on one device of several (a per-device input pipeline): the call and the
        # equations replayed inside it carry that device
        self._cur_device = self._args_device(args, jaxpr)
        if self._cur_device:
            w.set_device(eid, self._cur_device)
        names = self._arg_names(jaxpr, len(args))
        for slot, (x, ref) in enumerate(zip(args, refs)):
            w.add_input(eid, slot, *ref)
            self.store(eid, slot, x, name=names[slot], role=schema.ROLE_IN,
                        store=self._arg_needs_bytes(ref))
        self._call_refs, self._call_source, self._call_ns = refs, source, ns
        return eid

    def _record_eager(self, prim, params, args, out):
        self.eager += 1
        w = self.session.writer
        if prim.name == "name" and str(params.get("name", "")).startswith(OPTAX_TAG):
            self._pending_optim[params["name"][len(OPTAX_TAG):]] = self.optim_value(out)
        refs = [self.producer(x) for x in args]
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_EAGER, op=prim.name,
                          origin=schema.ORIGIN_EAGER, params=summarize_params(params, prim.name),
                          name_stack=self._name_stack(), source=self._live_source(), step=self.step)
        for slot, ref in enumerate(refs):
            w.add_input(eid, slot, *ref)
        outs = out if prim.multiple_results else [out]
        if self.per_device and outs:
            dev = devices.single_device(outs[0])
            if dev:
                w.set_device(eid, dev)
        keep = not self.filtered or self.opts.selected(prim.name, self._name_stack())
        for slot, x in enumerate(outs):
            self.store(eid, slot, x, store=keep)
            self._register(x, eid, slot)
