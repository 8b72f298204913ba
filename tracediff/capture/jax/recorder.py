"""JAX capture: every top-level jit call, every equation inside it, every eager primitive.

Faithful ("shadow") recording. A jitted call is recorded twice over: first its jaxpr is
replayed equation by equation from the call's real inputs (a small interpreter in the
style of `jax.core.eval_jaxpr`) and every equation's outputs are written, then the real
compiled executable runs and *its* outputs, the ones the script receives, are written
as the call's values. Replay numbers can differ from the compiled program (XLA fuses and
rewrites, e.g. `x / s` into `x * (1/s)`), so each event says where its values come
from (`origin`: compiled, replay, eager); the script's own results stay bitwise
identical to an unrecorded run because nothing replayed is ever returned to it.

Hooks (private, see internals.py): `pjit._pjit_call_impl_python` sees every concrete
jit call; `EvalTrace.process_primitive` sees eager primitives; `_get_fastpath_data`
returns None for intercepted calls so C++ dispatch does not hide calls 2..N.

Emitter API (public methods, used by probe.py and optax_tags as by the recorder itself):
`site(eqn)` (cached per-equation metadata), `bind(eqn, vals)` (run one equation),
`producer(x)` (the event that made an array), `eqn_event(...)` (write one equation's
event and input links), `store(eid, slot, x)` (write a value), `flush_optim()` (write
the tagged optax values as one step), `optax_update()` (bracket an optax update) and
`optax_settings(update)` (keep the settings of the update being called).
"""

import contextlib
import os
import sys
import threading
import weakref

import numpy as np

from ...trace import schema, values
from .. import Capture, ImportWatcher, optim_settings
from . import (device_digests, devices, digest_results, fastjit, host_replay, internals,
               nnx_paths, optax_tags)
from .probe import Prober
from .optax_tags import OPTAX_TAG

_CALL_PRIMS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
               "custom_vjp_call_jaxpr", "remat2", "checkpoint"}
_LOOP_PRIMS = {"while", "scan"}


class _Local(threading.local):
    suppress = 0        # >0 while tracediff itself is running JAX code
    intercepted = False  # the last jit call was recorded: deny it the C++ fast path
    optax_depth = 0


_TL = _Local()


# the params summary's bounds (they bound the trace's string table): one value's text,
# the whole summary's; a value or tail that does not fit is written "..." (replay then
# says the parameters were shortened), never cut in the middle
_PARAM_VALUE_CAP, _PARAMS_CAP = 60, 240
# primitives whose parameters are recorded whole, in a form replay rebuilds (their tuples
# of ints are bounded by the array's rank)
_WHOLE_PARAMS = frozenset({"conv_general_dilated"})


def _int_tuple(val):
    return isinstance(val, (tuple, list)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) or _int_tuple(x)
        for x in val)


def _param_text(val):
    """repr of one value; a ConvDimensionNumbers written as its three specs in full."""
    if type(val).__name__ == "ConvDimensionNumbers" and len(val) == 3 and _int_tuple(val):
        lhs, rhs, out = (tuple(int(d) for d in spec) for spec in val)
        return f"ConvDimensionNumbers(lhs_spec={lhs!r}, rhs_spec={rhs!r}, out_spec={out!r})"
    return repr(val)


def _summarize_params(params, prim=None):
    """`key=repr, ...` of an equation's parameters (sorted by name; jaxprs, callables and
    reprs holding addresses left out). Values over `_PARAM_VALUE_CAP` characters are
    written `key=...` and a summary over `_PARAMS_CAP` ends in `...` after its last whole
    value, except for `_WHOLE_PARAMS` primitives, whose int tuples and dimension numbers
    are written whole."""
    whole = prim in _WHOLE_PARAMS
    parts = []
    for key in sorted(params):
        val = params[key]
        tname = type(val).__name__
        if "Jaxpr" in tname or callable(val) or tname in ("WrappedFun",):
            continue
        if isinstance(val, (tuple, list)) and val and "Jaxpr" in type(val[0]).__name__:
            continue
        text = _param_text(val)
        if " at 0x" in text:
            continue
        if len(text) > _PARAM_VALUE_CAP and not (whole and (
                _int_tuple(val) or text.startswith("ConvDimensionNumbers("))):
            text = "..."
        part = f"{key}={text}"
        parts.append(part)
    out = ", ".join(parts)
    if whole or len(out) <= _PARAMS_CAP:
        return out
    while parts and len(", ".join(parts + ["..."])) > _PARAMS_CAP:
        parts.pop()
    return ", ".join(parts + ["..."])


class _Site:
    """Static facts about one jaxpr equation, computed once (jaxprs are cached by JAX)."""

    __slots__ = ("eqn", "op", "params", "name_stack", "source", "sub", "mode", "literals",
                 "rows", "rows_writer", "tag")

    def __init__(self, eqn, session):
        self.eqn = eqn  # keeps id(eqn) valid as a cache key
        # per writer (`JaxCapture.eqn_event`): the events' constant parts by (name-stack
        # prefix, call source, origin, device), and the literals prepared for the writer
        self.rows, self.rows_writer = {}, None
        prim = eqn.primitive.name
        # nested jits are named like top-level calls: `jit:_normal_real`, whatever the
        # primitive is called in this JAX version (`pjit` before 0.7)
        self.op = f"jit:{eqn.params.get('name', '?')}" if prim in internals.JIT_NAMES else prim
        self.params = _summarize_params(eqn.params, prim)
        self.name_stack = str(eqn.source_info.name_stack)
        tb = eqn.source_info.traceback
        self.source = None if tb is None else \
            session.jax_site((fr.file_name, fr.line_num) for fr in tb.frames)
        # literal inputs (`mul x 2.0`), stored as role-IN values so that replay and repro
        # can rebuild the op from the trace alone
        self.literals = []
        from jax.extend.core import Literal

        for slot, v in enumerate(eqn.invars):
            if isinstance(v, Literal):
                try:
                    self.literals.append((slot, np.asarray(v.val, dtype=v.aval.dtype)))
                except Exception:  # a literal numpy cannot hold (PRNG key): left unrecorded
                    pass
        # the optax tag of a `name` equation (optax_tags), else None
        self.tag = eqn.params["name"][len(OPTAX_TAG):] if prim == "name" and \
            str(eqn.params.get("name", "")).startswith(OPTAX_TAG) else None
        self.sub, self.mode = None, "bind"
        p = eqn.params
        if prim in _CALL_PRIMS:
            from jax.extend.core import ClosedJaxpr

            for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
                sub = p.get(key)
                if sub is None:
                    continue
                if not isinstance(sub, ClosedJaxpr) and hasattr(sub, "eqns"):
                    sub = ClosedJaxpr(sub, ())
                if isinstance(sub, ClosedJaxpr) and len(sub.jaxpr.invars) == len(eqn.invars):
                    self.sub, self.mode = sub, "call"
                break
        elif prim == "cond":
            self.mode = "cond"
        elif prim in _LOOP_PRIMS:
            self.mode = prim
        elif prim == "shard_map" and "mesh" in p and "jaxpr" in p and "in_specs" in p:
            self.mode = "shard_map"   # replayed per device (devices.BodyReplay)
        if eqn.effects and not eqn.outvars:
            self.mode = "skip"  # debug prints and other output-less effects: never run twice


def _jaxpr_has_tag(jaxpr, depth):
    """True when a jaxpr (or one nested in its equations' params) tags optax values."""
    return internals.any_equation(
        jaxpr, lambda e: e.primitive.name == "name" and
        str(e.params.get("name", "")).startswith(OPTAX_TAG), False, depth)
    for eqn in getattr(jaxpr, "eqns", ()):
        if eqn.primitive.name == "name" and str(eqn.params.get("name", "")).startswith(OPTAX_TAG):
            return True
        for val in eqn.params.values():
            for sub in (val if isinstance(val, (tuple, list)) else (val,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and _jaxpr_has_tag(inner, depth + 1):
                    return True
    return False


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


class JaxCapture(Capture):
    framework = "jax"
    trigger = "jax"

    def __init__(self):
        self.session = None
        self.step = 0
        self._sites = {}
        self._producers = {}        # id(array) -> (weakref, event, slot)
        self._pending_optim = {}    # optax tag -> numpy value, flushed as one optim event
        self._optax_settings = []   # the last optax update's settings (optim_settings rows)
        self._orig = {}
        self.calls = self.eqns = self.eager = 0
        self.replay_errors = []
        self.fidelity = {"calls_compared": 0, "calls_where_replay_differs": 0,
                         "max_rel_difference": 0.0, "examples": []}
        self.opaque_calls = 0
        self.prober = None
        self.shards = 0
        self.per_device = True
        self._cur_device = None   # the one device of the call being replayed, if any
        self._mesh_calls = {}     # id(jaxpr) -> (jaxpr, holds a shard_map)
        self._dtype_names = {}    # dtype -> str(dtype)
        self.fast_calls = 0       # calls recorded around JAX's fast path (fastjit)

    # -- install -----------------------------------------------------------------------------
    def install(self, session):
        core, pjit, siu = internals.check()   # raises UnsupportedJax
        import jax

        self.session, self._core, self._pjit, self._siu = session, core, pjit, siu
        self.stepped = session.options.loops == "stepped"
        # Levels and windows (RecordOptions): `calls` records top-level calls only (no
        # replay, no eager primitives); outside a --steps window nothing is recorded and
        # optax steps are only counted; --ops/--modules keep values of matching events.
        self.opts = session.options
        self.calls_only = getattr(self.opts, "level", "full") == "calls"
        self.filtered = bool(getattr(self.opts, "filtered", False))
        self._optax_calls = {}      # id(jaxpr) -> (jaxpr, contains optax tags)
        self._light_plans = {}      # id(jaxpr) -> _LightPlan
        probe = getattr(self.opts, "probe", None)
        self.prober = Prober(self, probe) if probe and not self.calls_only else None
        # per-device capture (devices): shards/replicas of global arrays, shard_map and
        # pmap bodies replayed per device; `RecordOptions(devices=False)` turns it off
        self.per_device = bool(getattr(self.opts, "devices", True))
        self.bodies = devices.BodyReplay(self)
        # `--jax-values compiled`: each call's equation values come from its jaxpr compiled
        # once (cached per jaxpr) with every equation's outputs as extra outputs, instead of
        # the op-by-op replay; calls matched by --probe keep the replay (and their probe)
        # `auto` (the default) is decided per backend at the first recorded call or
        # primitive (`_decide`: the script may still choose its platform after importing
        # jax), as is the trace's hash and hashing on the device (device_digests)
        self.digests = self.values_prober = None
        self.values_mode = getattr(self.opts, "jax_values", "auto")
        self.host = host_replay.HostReplay(False)
        self._decided = False
        # capture/ as a whole (this package and the modules it shares with torch's) is
        # tracediff's own code, never an equation's user frame
        siu.register_exclusion(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import jaxlib

        session.site_skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib))
        self._orig = {"impl": pjit._pjit_call_impl_python, "fast": pjit._get_fastpath_data,
                      "pp": core.EvalTrace.process_primitive}
        pjit._pjit_call_impl_python = self._impl_hook
        pjit._get_fastpath_data = self._fast_hook
        core.EvalTrace.process_primitive = self._make_pp_hook()
        if self.calls_only and fastjit.enabled():   # the script's jits keep the fast path
            self._orig["jit"] = jax.jit
            jax.jit = fastjit.patched_jit(self, jax.jit)
        jax.clear_caches()
        self._optax = ImportWatcher({"optax": self._patch_optax, "flax.nnx": self._patch_nnx})
        self._optax.install()

    def _decide(self):
        """Per-backend choices, once, before the first value is written."""
        if self._decided:
            return
        self._decided = True
        import jax

        accelerator = jax.default_backend() != "cpu"
        self.host.accelerator = host_replay.applies(accelerator)
        self._choose_hash(self.session.writer)
        if self.values_mode == "auto":   # the faithful fast default of this backend
            self.values_mode = "compiled" if accelerator else "replay"
        self.values_prober = Prober(self, ".*", values_mode=True) \
            if self.values_mode == "compiled" and not self.calls_only else None

    def _choose_hash(self, w):
        """The trace's hash (`record --hash`): words64 where values are hashed on their
        device (an accelerator, by default), which the host computes too (CPU traces
        compare with TPU traces hash to hash under --hash words64); else xxh3_64."""
        want = getattr(self.opts, "hash", "auto")
        device = digest_results.on_device()
        if want == "auto":
            want = values.WORDS_HASH_NAME if device else values.HASH_NAME
        if not w.use_hash(want):   # values already written (another framework): keep theirs
            return
        if want == values.WORDS_HASH_NAME and device:
            self.digests = device_digests.DeviceDigests(w, self._quiet)

    def _outputs(self):
        """A call's outputs: hashed on the device as one program (device_digests)."""
        if self.digests is None or self.session.writer.level == "full":
            return contextlib.nullcontext()
        return self.digests.outputs()

    def _fetch_at_full(self, xs, same_as=None):
        """Level full, values hashed on the device: [(what to store, hash, kept)] of a
        call's outputs (or an optimizer step's values) by one program and few copies
        (`DeviceDigests.fetch`): a `HostView` where the value came back joined, else the
        array; (x, None, None) for each value `store` hashes itself (and at other levels);
        a `digest_results.Fetched` gives its own (an optimizer step's value fetched with its
        values program's). `same_as`: the values program's final outputs (`Fetched`) of a
        call whose outputs these are: an output with the same hash, dtype and shape points
        at the bytes the trace holds for it already (`kept`: their blob offset), and its
        own bytes never cross to the host."""
        out = [(x.value, x.h, x.kept) if type(x) is digest_results.Fetched else (x, None, None)
               for x in xs]
        if self.digests is None or self.session.writer.level != "full":
            return out
        at = [i for i, x in enumerate(xs) if x is not None and type(x) is not
              digest_results.Fetched and digest_results.can_digest(x)]
        if at:
            twins = [None] * len(xs)
            if same_as is not None and len(same_as) == len(xs):
                twins = [f if type(f) is digest_results.Fetched and f.kept is not None else None
                         for f in same_as]
            try:
                got = self.digests.fetch([xs[i] for i in at],
                                         copy=any(twins[i] is None for i in at))
            except Exception:   # never break the script: `store` takes each value alone
                return out
            for i, (h, host) in zip(at, got):
                f, kept = twins[i], None
                if f is not None and f.h == h and f.value.dtype == xs[i].dtype and \
                        tuple(f.value.shape) == tuple(xs[i].shape):
                    kept = f.kept
                out[i] = (xs[i] if host is None else host, h, kept)
        return out

    @staticmethod
    @contextlib.contextmanager
    def _quiet():
        _TL.suppress += 1
        try:
            yield
        finally:
            _TL.suppress -= 1

    def uninstall(self):
        if not self._orig:
            return
        self._optax.uninstall()
        self._unpatch_optax()
        self._unpatch_nnx()
        self._pjit._pjit_call_impl_python = self._orig["impl"]
        self._pjit._get_fastpath_data = self._orig["fast"]
        self._core.EvalTrace.process_primitive = self._orig["pp"]
        if "jit" in self._orig:
            import jax

            jax.jit = self._orig.pop("jit")
        self.flush_optim()
        if self.session is not None and self.session.active:
            w = self.session.writer
            try:
                dist = devices.distributed_section(w._manifest.get("distributed"))
            except Exception:  # informative only
                dist = None
            if dist is not None:
                w.update_manifest(distributed=dist)
        if self.session is None or not self.session.ends_process:   # ~0.15 s: only where
            # the script goes on after the recording (the API), not at the process's end
            import jax

            jax.clear_caches()  # calls recorded without the C++ fast path get it back

    def manifest(self):
        import jax

        if self.digests is not None:   # the probes' checks answered since the last drain
            self.digests.settle_checks()
        cfg = jax.config
        out = {
            "version": jax.__version__,
            "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
            "mode": "shadow: jit calls return their real compiled outputs (origin=compiled); "
                    "equations inside them are replayed one by one from the call's real inputs "
                    "(origin=replay), which can differ from the fused program",
            "loops": self.session.options.loops if self.session else None,
            "calls": self.calls, "equations": self.eqns, "eager_primitives": self.eager,
            "optimizer_steps": self.step, "calls_not_replayed": self.opaque_calls,
            "level": getattr(self.opts, "level", "full") if self.session else None,
            "replay_errors": self.replay_errors[:20],
            "replay_vs_compiled": dict(self.fidelity, note="replayed call outputs compared with "
                                       "the compiled outputs the script received"),
            "untested_version": internals.untested_version(),
        }
        try:   # primitives whose lowering was replaced from outside JAX (a sitecustomize)
            out["python_kernels"] = internals.lowering_overrides()
        except Exception as exc:  # informative only
            out["python_kernels"] = f"unavailable: {type(exc).__name__}"
        if self.prober is not None:
            out["probe"] = self.prober.manifest()
        out["per_device"] = {"enabled": self.per_device, "shard_rows": self.shards,
                             "shard_map_bodies": self.bodies.bodies if self.session else 0,
                             "device_events": self.bodies.device_events if self.session else 0}
        if "jit" in self._orig or self.fast_calls:
            out["calls_on_fast_path"] = {
                "calls": self.fast_calls,
                "note": "--level calls: jit calls of functions with no static arguments ran "
                        "through JAX's C++ fast path (the script's own executable), recorded "
                        "around it where in the --steps window (capture/fastjit.py)"}
        out["values"] = self.values_mode if self.session else None
        if self.session:
            out["values_default"] = "auto: compiled on an accelerator, replay on the CPU" \
                if getattr(self.opts, "jax_values", "auto") == "auto" else "chosen"
            out["hash"] = self.session.writer.hash_name
            out["digests_on_device"] = None if self.digests is None else {
                "values": self.digests.values, "batches": self.digests.batches}
            out["replayed_on_host_cpu"] = self.host.manifest()
        if getattr(self, "values_prober", None) is not None:
            out["mode"] = ("shadow: jit calls return their real compiled outputs (origin=compiled); "
                           "the values of the equations inside them come from the call's jaxpr "
                           "compiled once with every equation's outputs as extra outputs "
                           "(origin=probe, one `probe:<name>` call per jit call), which XLA may "
                           "fuse differently from the script's program; --probe calls are "
                           "replayed op by op (origin=replay)")
            out["compiled_values"] = self.values_prober.manifest()
        for name in ("jax_enable_x64", "jax_default_matmul_precision", "jax_threefry_partitionable",
                     "jax_default_prng_impl", "jax_numpy_rank_promotion", "jax_disable_jit",
                     "jax_platforms", "jax_enable_checks"):
            try:
                out[name] = getattr(cfg, name)
            except AttributeError:
                pass
        try:
            out["backend"] = jax.default_backend()
            out["devices"] = [str(d) for d in jax.devices()]
            out["device_kind"] = jax.devices()[0].device_kind
        except Exception as exc:  # a broken backend is itself worth recording
            out["backend_error"] = repr(exc)
        return out

    # -- hooks -------------------------------------------------------------------------------
    def _fast_hook(self, *args, **kwargs):
        if _TL.intercepted:
            _TL.intercepted = False
            return None
        return self._orig["fast"](*args, **kwargs)

    def _impl_hook(self, *args, jaxpr, **params):
        orig = self._orig["impl"]
        if _TL.suppress or not self.session.active or not self._core.trace_state_clean():
            return orig(*args, jaxpr=jaxpr, **params)
        if not self._decided:
            self._decide()
        if self.calls_only or not self._in_window():
            return self._call_light(orig, args, jaxpr, params)
        _TL.suppress += 1  # everything below is tracediff's own JAX work: never recorded
        try:
            with self.session.lock:
                call_id = self._record_call_start(params.get("name", "?"), jaxpr, args)
                name = params.get("name", "?")
                replayed = valued = None
                host = self.host.wants(jaxpr)   # float64/complex128 on an accelerator
                if self.values_prober is not None and not host and not (
                        self.prober is not None and self.prober.wants(name)):
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
                result = orig(*args, jaxpr=jaxpr, **params)
                outs = internals.call_outputs(result)
                if not host:
                    self._measure_replay(name, replayed, outs)
                if probed is not None:
                    self.prober.check(name, probed, outs)
                names = self._result_names(jaxpr, len(outs))
                fetched = self._fetch_at_full(outs, same_as=valued)
                with self._outputs():
                    refs = [self.store(call_id, slot, v, name=names[slot], h=h, kept=kept)
                            for slot, (v, h, kept) in enumerate(fetched)]
                    for slot, x in enumerate(outs):
                        self._register(x, call_id, slot)
                if valued is not None:   # by the hashes of both sides where they were made
                    if all(h is not None for _, h, _ in fetched):   # level full: as fetched
                        refs = [digest_results.Fetched(v, h) for v, h, _ in fetched]
                    self.values_prober.check(name, valued, outs, refs)
                if not _TL.optax_depth:  # a jit call inside an eager optax update is not its end
                    self.flush_optim()
                if self.digests is not None:
                    self.digests.dispatch()
        finally:
            _TL.suppress -= 1
        _TL.intercepted = True
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
        _TL.intercepted = True
        return result[0]

    @staticmethod
    def own_work():
        """Is tracediff's own JAX work running (nothing of it is recorded)?"""
        return _TL.suppress > 0

    def records_fast_calls(self):
        """Is a `fastjit.FastJit` call to be recorded now (a concrete call of the
        script's, not tracediff's own JAX work)?"""
        return not self.own_work() and self.session is not None and self.session.active and \
            self._core.trace_state_clean()

    def record_light_call(self, name, jaxpr, args, run):
        """`_call_light`'s recording of one call: `args` its flat inputs, `run()` runs it
        and returns its flat outputs (the hook's compiled call, or a `FastJit`'s)."""
        if not self._decided:
            self._decide()
        record = self._in_window()
        _TL.suppress += 1
        try:
            with self.session.lock:
                if self._pending_optim and not _TL.optax_depth:  # eager optax tags since the
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
            _TL.suppress -= 1

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

    def _has_optax(self, closed):
        """Does this call's jaxpr (at any depth) hold optax step tags? (cached)"""
        hit = self._optax_calls.get(id(closed))
        if hit is not None and hit[0] is closed:
            return hit[1]
        found = _jaxpr_has_tag(getattr(closed, "jaxpr", closed), 0)
        self._optax_calls[id(closed)] = (closed, found)
        return found

    def _make_pp_hook(self):
        capture, orig = self, self._orig["pp"]
        jit_names = internals.JIT_NAMES

        def process_primitive(trace, prim, args, params, /):
            if _TL.suppress or prim.name in jit_names or not capture.session.active:
                return orig(trace, prim, args, params)
            if capture.calls_only or not capture._in_window():
                # not recorded: only an eager optax step is counted (at the next call)
                if prim.name == "name" and str(params.get("name", "")).startswith(OPTAX_TAG):
                    capture._pending_optim[params["name"][len(OPTAX_TAG):]] = None
                _TL.suppress += 1  # an eager primitive's own jit dispatch is not a call
                try:
                    return orig(trace, prim, args, params)
                finally:
                    _TL.suppress -= 1
            _TL.suppress += 1
            try:
                out = orig(trace, prim, args, params)
                if not capture._decided:
                    capture._decide()
                with capture.session.lock:
                    capture._record_eager(prim, params, args, out)
            finally:
                _TL.suppress -= 1
            return out

        return process_primitive

    # -- recording -----------------------------------------------------------------------------
    def _live_source(self):
        """events.source of an eager primitive or a call, from the live stack
        (`Session.jax_site`)."""
        def frames(f):
            while f is not None:
                yield f.f_code.co_filename, f.f_lineno
                f = f.f_back
        return self.session.jax_site(frames(sys._getframe(2)))

    def _name_stack(self):
        return str(self._siu.current_name_stack())

    def producer(self, x, label="input"):
        """(event, slot) that produced array x; unseen arrays get an `input` snapshot event."""
        entry = self._producers.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1], entry[2]
        if isinstance(x, (int, float, complex, bool, np.generic)):
            return schema.PRODUCER_LITERAL, 0
        w = self.session.writer
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_INPUT, op="input",
                          origin=schema.ORIGIN_SNAPSHOT, params=label, name_stack=self._name_stack(),
                          source=self._live_source(), step=self.step)
        self.store(eid, 0, x)
        self._register(x, eid, 0)
        return eid, 0

    def _register(self, x, eid, slot):
        try:
            self._producers[id(x)] = (weakref.ref(x), eid, slot)
        except TypeError:
            pass
        if len(self._producers) > 200_000:  # drop dead entries now and then
            self._producers = {k: v for k, v in self._producers.items() if v[0]() is not None}

    def optim_value(self, x):
        """An optax-tagged value kept for the step's event: on the host, or left on its
        device where values are hashed there (stored by `store` at `flush_optim`)."""
        return x if self.digests is not None and digest_results.can_digest(x) else self._host(x)

    def store(self, eid, slot, x, name=None, role=schema.ROLE_OUT, store=True, stats=None,
              h=None, kept=None):
        """Write one value (an array, a Python scalar, or a `digest_results.Ref` to a value
        digested already); returns its `Ref` where it is hashed on the device, else None.
        `kept`: with `h`, where the blob holds x's bytes already (`digest_results.Fetched`)."""
        w = self.session.writer
        if type(x) is digest_results.Ref:   # an optimizer step's value, digested in its program
            self.digests.add_ref(eid, slot, x, role, name)
            return x
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            if isinstance(x, (int, float, complex, bool, np.generic)):
                w.add_value(eid, slot, np.asarray(x), role=role, name=name, store=store)
            return
        if not store:  # outside an --ops/--modules window: shape and dtype only
            text = self._dtype_names.get(dtype)
            if text is None:   # str(dtype) costs ~5 us; a call's arguments, every step
                text = self._dtype_names[dtype] = str(dtype)
            w.add_meta_value(eid, slot, text, getattr(x, "shape", ()), role=role, name=name)
            return
        logical = None
        if internals.is_key_dtype(dtype):
            import jax

            logical, x = str(dtype), jax.random.key_data(x)
        elif kept is not None and h is not None:   # bytes held already: a row, no array
            w.add_kept_value(eid, slot, dtype, tuple(x.shape), kept, h, role=role, name=name)
            return
        if h is None and self.digests is not None and digest_results.can_digest(x):
            if w.level != "full":   # hash and statistics on the device: no bytes cross
                return self.digests.add(eid, slot, x, role, name, logical)
            try:
                h, arr = self.digests.fetch([x])[0]
            except Exception:   # a program the device could not run: hashed on the host
                h, arr = None, None
        else:
            arr = None
        try:
            arr = np.asarray(x if arr is None else arr)
        except Exception:  # tokens, non-addressable arrays: keep shape and dtype only
            w.add_meta_value(eid, slot, str(dtype), getattr(x, "shape", ()), role=role, name=name)
            if self.per_device:   # a process's own shards of a multi-process array
                self.shards += devices.store_shards(w, eid, slot, x, None, role, logical)
            return
        w.add_value(eid, slot, arr, role=role, name=name, logical_dtype=logical, stats=stats, h=h)
        if self.per_device:
            self.shards += devices.store_shards(w, eid, slot, x, arr, role, logical)

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

    def _args_device(self, args, closed):
        """The one device a call runs on: all its array arguments on that device and no
        mesh in its program (a shard_map spans the mesh's devices); else None."""
        if not self.per_device:
            return None
        devs = {devices.single_device(x) for x in args if hasattr(x, "sharding")}
        if len(devs) != 1 or None in devs:
            return None
        hit = self._mesh_calls.get(id(closed))
        if hit is None or hit[0] is not closed:
            hit = self._mesh_calls[id(closed)] = (closed, devices.has_mesh(closed.jaxpr))
        return None if hit[1] else devs.pop()

    def _arg_needs_bytes(self, ref):
        """A call argument produced by a recorded event is that event's output, already
        hashed and stored: the call keeps only its name, dtype and shape (locate follows the
        dataflow edge), which halves the work per call at --level calls. Arguments with no
        recorded producer, and any argument under an --ops/--modules window (whose producer
        may not have kept its value), are stored."""
        return ref[0] < 0 or self.filtered

    @staticmethod
    def _arg_names(jaxpr, n):
        names = getattr(getattr(jaxpr.jaxpr, "debug_info", None), "arg_names", None)
        return list(names) if names is not None and len(names) == n else [None] * n

    @staticmethod
    def _result_names(jaxpr, n):
        names = getattr(getattr(jaxpr.jaxpr, "debug_info", None), "result_paths", None)
        if callable(names) or names is None or len(names) != n:
            return [None] * n
        return list(names)

    def _record_eager(self, prim, params, args, out):
        self.eager += 1
        w = self.session.writer
        if prim.name == "name" and str(params.get("name", "")).startswith(OPTAX_TAG):
            self._pending_optim[params["name"][len(OPTAX_TAG):]] = self.optim_value(out)
        refs = [self.producer(x) for x in args]
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_EAGER, op=prim.name,
                          origin=schema.ORIGIN_EAGER, params=_summarize_params(params, prim.name),
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

    @staticmethod
    def _host(x):
        try:
            return np.array(x, copy=True)
        except Exception:
            return None

    # -- replay --------------------------------------------------------------------------------
    def _replay_call(self, call_id, closed, args, host=False):
        effects = [e for e in closed.effects if "Debug" not in type(e).__name__]
        if effects:  # ordered effects, io_callback, state: replay would repeat side effects
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
        compiled outputs (what the script got); the totals go into the manifest."""
        if replayed is None or len(replayed) != len(compiled):
            return
        worst = 0.0
        differs = False
        for r, c in zip(replayed, compiled):
            try:
                r, c = np.asarray(r), np.asarray(c)
            except Exception:  # PRNG keys, tokens: not numbers to compare
                continue
            if r.shape != c.shape or r.dtype != c.dtype or values.same_bytes(r, c):
                continue
            differs = True
            if r.dtype.kind in "fc" and r.size:
                worst = max(worst, _max_rel_difference(r, c))
        fid = self.fidelity
        fid["calls_compared"] += 1
        if differs:
            fid["calls_where_replay_differs"] += 1
            fid["max_rel_difference"] = max(fid["max_rel_difference"], worst)
            if len(fid["examples"]) < 5 and name not in fid["examples"]:
                fid["examples"].append(name)

    def site(self, eqn):
        site = self._sites.get(id(eqn))
        if site is None or site.eqn is not eqn:
            site = self._sites[id(eqn)] = _Site(eqn, self.session)
        return site

    def _interpret(self, closed, vals, refs, call_id, parent, prefix, it, source):
        from jax.extend.core import Literal

        jaxpr = closed.jaxpr
        env = {}
        for v, c in zip(jaxpr.constvars, closed.consts):
            env[v] = (c, self.producer(c, "constant"))
        for v, x, r in zip(jaxpr.invars, vals, refs):
            env[v] = (x, r)

        def read(v):
            if isinstance(v, Literal):
                return v.val, (schema.PRODUCER_LITERAL, 0)
            return env[v]

        for eqn in jaxpr.eqns:
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
                    self._pending_optim[eqn.params["name"][len(OPTAX_TAG):]] = self.optim_value(x)
                if type(v).__name__ != "DropVar":
                    env[v] = (x, (eid, slot))
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

    def registered(self, x):
        """(event, slot) of an array already registered as produced, else None."""
        entry = self._producers.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1], entry[2]
        return None

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

    # -- optimizer steps (optax) -------------------------------------------------------------
    @contextlib.contextmanager
    def optax_update(self):
        """Bracket one optax `update` call (optax_tags wraps every transformation's).
        Yields True for the outermost update of an active session: the one whose grads,
        params, updates and state are tagged as the optimizer step."""
        outer = _TL.optax_depth == 0 and self.session is not None and self.session.active
        _TL.optax_depth += 1
        try:
            yield outer
        finally:
            _TL.optax_depth -= 1

    def optax_settings(self, update):
        """Keep the settings of the outermost optax update being called (its closures,
        `optim_settings.optax_settings`), written with every step after it: a jitted step
        calls `update` once, while tracing."""
        try:
            self._optax_settings = optim_settings.optax_settings(update)
        except Exception as exc:   # never fail the program for its settings
            self._optax_settings = []
            self.replay_errors.append(f"optax settings not recorded: {type(exc).__name__}")

    def flush_optim(self):
        """Write the optax values tagged during the last call (or eager update) as one step."""
        if not self._pending_optim or not self.session.active:
            return
        if self.calls_only or not self._in_window() or \
                all(v is None for v in self._pending_optim.values()):
            self._pending_optim = {}  # counted, not recorded (outside the window)
            self.step += 1
            return
        w = self.session.writer
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_OPTIM, op="optim:optax",
                          phase=schema.PHASE_OPTIM, origin=schema.ORIGIN_REPLAY,
                          params="optax update: grads, params, updates, state after the step",
                          step=self.step)
        for row in self._optax_settings:
            w.add_optim_setting(eid, *row)
        taken = sorted(self._pending_optim.items())
        fetched = self._fetch_at_full([arr for _, arr in taken])
        with self._outputs():   # hashed on the device as one program, as a call's outputs
            for slot, ((name, arr), (v, h, kept)) in enumerate(zip(taken, fetched)):
                if arr is not None:   # bytes the trace holds already: pointed at
                    self.store(eid, slot, v, name=name, h=h, kept=kept)
        self._pending_optim = {}
        self.step += 1

    def _patch_optax(self):
        self._optax_patch = optax_tags.install(self)

    def _patch_nnx(self):
        """NNX modules push no name scope of their own: give them their graph paths."""
        self._nnx_paths = nnx_paths.NnxPaths()
        try:
            self._nnx_paths.install()
        except Exception as exc:   # another Flax: record without NNX paths, never fail
            self._nnx_paths = None
            self.replay_errors.append(f"NNX module paths not recorded: {type(exc).__name__}")

    def _unpatch_nnx(self):
        paths = getattr(self, "_nnx_paths", None)
        if paths is not None:
            paths.uninstall()
            self._nnx_paths = None

    def _unpatch_optax(self):
        patch = getattr(self, "_optax_patch", None)
        if patch is not None:
            patch.uninstall()
            self._optax_patch = None


def _max_rel_difference(r, c, chunk=1 << 15):
    """max |r - c| / max(|c|, tiny) over the arrays, NaNs ignored (0.0 if every one is
    NaN): the difference in float64 (complex128 for complex values), |c| in c's own
    dtype, the same numbers as one complex128 pass over everything. A few differing
    elements (XLA fused one op): those alone; many: cache-sized chunks, so the wide
    temporaries are never a fresh array as large as the outputs (a train step's are its
    parameters and optimizer state, every call)."""
    wide = np.complex128 if r.dtype.kind == "c" else np.float64
    tiny = np.finfo(r.dtype).tiny
    with np.errstate(all="ignore"):
        differ = r != c      # equal elements add 0 (or NaN: inf - inf), never the maximum
        n = int(np.count_nonzero(differ))
        if n == 0:
            return 0.0       # only the bytes differ (-0.0 and 0.0, NaN payloads)
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
