"""Calls an accelerator cannot be trusted to replay equation by equation: replayed on the
host CPU instead (issue 37, item 3).

On a TPU, float64 is emulated and complex128 partly unimplemented. A script's float64 +
complex `expm` program fails there with a Python exception (`UNIMPLEMENTED ...
LuDecomposition c128`, exit 1), but a lone `convert_element_type f64[] -> c128[]`
compiled by itself for the replay aborts the process inside libtpu (SIGABRT, exit 134):
the recording would change how the script ends. So on an accelerator a call whose jaxpr
holds a 64-bit float or complex128 value is replayed on the host's CPU backend (its
inputs copied there; its equations' values are CPU values, counted in the manifest as
`replayed_on_host_cpu`), and is never compiled op by op, nor as a values program, on the
device. The real compiled call still runs where the script put it, and fails or not as
it does without tracediff. Where no CPU backend is there (JAX_PLATFORMS=tpu), the call
is not replayed (`calls_not_replayed`).
"""

from . import internals

_WIDE = frozenset(("float64", "complex128"))


def _wide_var(v):
    dt = getattr(getattr(v, "aval", None), "dtype", None)
    return dt is not None and getattr(dt, "name", str(dt)) in _WIDE


def applies(accelerator):
    """Replay wide calls on the host? On an accelerator; TRACEDIFF_JAX_WIDE_ON_HOST=1 also
    on the CPU backend (the tests run this code path there), 0 never."""
    import os

    forced = os.environ.get("TRACEDIFF_JAX_WIDE_ON_HOST")
    return forced == "1" if forced in ("0", "1") else accelerator


class HostReplay:
    """Which calls replay on the host CPU, and doing it (one per recording)."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.calls = 0           # calls replayed on the host CPU
        self.unavailable = 0     # calls that needed it where no CPU backend is
        self._seen = {}          # id(closed jaxpr) -> (closed jaxpr, holds wide values)
        self._cpu = False

    def wants(self, closed):
        """Does this call, on this backend, replay on the host CPU? (cached per jaxpr)"""
        if not self.accelerator:
            return False
        hit = self._seen.get(id(closed))
        if hit is None or hit[0] is not closed:
            jaxpr = closed.jaxpr
            wide = any(_wide_var(v) for v in (*jaxpr.invars, *jaxpr.outvars, *jaxpr.constvars)) \
                or internals.any_equation(
                    jaxpr, lambda e: any(_wide_var(v) for v in (*e.invars, *e.outvars)), True)
            hit = self._seen[id(closed)] = (closed, wide)
        return hit[1]

    def device(self):
        """The host's first CPU device, or None where JAX has no CPU backend."""
        if self._cpu is False:
            import jax

            try:
                self._cpu = jax.devices("cpu")[0]
            except Exception:   # JAX_PLATFORMS without cpu
                self._cpu = None
        return self._cpu

    def inputs(self, args):
        """The call's arguments copied to the host CPU (None: no CPU backend)."""
        cpu = self.device()
        if cpu is None:
            self.unavailable += 1
            return None
        import jax

        self.calls += 1
        return [jax.device_put(x, cpu) if hasattr(x, "dtype") and hasattr(x, "sharding")
                else x for x in args]

    def manifest(self):
        return {"calls": self.calls, "calls_without_a_cpu_backend": self.unavailable,
                "why": "on an accelerator, calls holding float64/complex128 values are "
                       "replayed on the host CPU: a lone program over one can abort the "
                       "process there (libtpu), where the script's own program raises"}
