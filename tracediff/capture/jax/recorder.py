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

`JaxCapture` is built from one base class per concern, each in its own module: the hooks
(dispatch.py), calls recorded by inputs and outputs only (light_calls.py), the jaxpr
interpreter (replay.py, with sites.py), values and their producers (value_store.py),
source lines and names (naming.py), optax steps (optimizer.py) and devices (devices.py).
This module installs them into JAX, chooses per backend, and writes the manifest.

Emitter API (public methods, used by probe.py and optax_tags as by the recorder itself):
`site(eqn)` (cached per-equation metadata), `bind(eqn, vals)` (run one equation),
`producer(x)` (the event that made an array), `eqn_event(...)` (write one equation's
event and input links), `store(eid, slot, x)` (write a value), `flush_optim()` (write
the tagged optax values as one step), `optax_update()` (bracket an optax update) and
`optax_settings(update)` (keep the settings of the update being called).
"""

import os

from .. import Capture, ImportWatcher, skipped
from . import devices, fastjit, host_replay, internals, program_cache, replay
from .dispatch import _Dispatch
from .devices import _Devices
from .light_calls import _LightCalls
from .naming import _Naming
from .optimizer import _Optimizer
from .probe import Prober
from .replay import _Replay
from .value_store import _Values


class JaxCapture(_Dispatch, _LightCalls, _Replay, _Values, _Naming, _Optimizer, _Devices,
                 Capture):
    """The JAX capture, one concern per base class (see the module docstring): installed
    when the script imports jax, uninstalled at the recording's end; its manifest."""

    framework = "jax"
    trigger = "jax"

    def __init__(self):
        self.session = None
        self.step = 0
        self._sites = {}
        self._drop_plans = {}       # id(jaxpr) -> (jaxpr, variables dropped after each eqn)
        self._call_donated = frozenset()   # ids of the recorded call's donated arguments
        self._hashed = {}           # id(array) -> (weakref, hash): written once this call
        self._producers = {}        # id(array) -> (weakref, event, slot)
        self._pending_optim = {}    # optax tag -> numpy value, flushed as one optim event
        self._optax_settings = []   # the last optax update's settings (optim_settings rows)
        self.skipped_settings = skipped.settings()   # unreadable: the manifest's
        self._orig = {}
        self.calls = self.eqns = self.eager = 0
        self.replay_errors = []
        self.fidelity = {"calls_compared": 0, "calls_where_replay_differs": 0,
                         "calls_measured": 0, "max_rel_difference": 0.0, "examples": []}
        self._differing_calls = {}  # jitted function's name -> calls whose replay differed
        self.opaque_calls = 0
        self.prober = None
        self.shards = 0
        self.per_device = True
        self._cur_device = None   # the one device of the call being replayed, if any
        self._mesh_calls = {}     # id(jaxpr) -> (jaxpr, holds a shard_map)
        self._dtype_names = {}    # dtype -> str(dtype)
        self.fast_calls = 0       # calls recorded around JAX's fast path (fastjit)

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
        self._prepared_outputs = {}   # id(jaxpr) -> jaxpr whose outputs' programs were started
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
        # tracediff's own XLA programs (values, digests) kept compiled between runs
        self.programs = program_cache.ProgramCache()
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
        self.programs.close()   # compiles not started are dropped
        if self.session is not None and self.session.active:
            self._record_distributed()
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
            "replay_vs_compiled": dict(self.fidelity, note=(
                "replayed call outputs compared with the compiled outputs the script "
                "received, by their hashes at every call; max_rel_difference over the "
                "calls_measured of the differing calls: each jitted function's first "
                f"{replay.MEASURED_FIRST} that differ, then its 16th, 32nd, 64th...")),
            "untested_version": internals.untested_version(),
        }
        if self.skipped_settings:
            out["skipped_settings"] = self.skipped_settings.manifest()
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
                "values": self.digests.values, "batches": self.digests.batches,
                "groups": None if self.digests.groups is None else
                self.digests.groups.manifest()}
            out["replayed_on_host_cpu"] = self.host.manifest()
        if getattr(self, "programs", None) is not None:
            out["program_cache"] = self.programs.manifest()
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
