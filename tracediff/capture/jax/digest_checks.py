"""Answers to "do these two lists of JAX arrays hold the same bytes?", asked while a call is
recorded and read later (a values program's final outputs against the script's compiled
outputs: probe.py's `check`), on the device where both arrays are, with no wait for it.
"""

import numpy as np

from ...trace import values
from .digest_programs import words
from .digest_results import can_digest

MAX_CHECKS = 4096           # checks not yet read


class SameLater:
    """DeviceDigests' checks: `self.checks` holds (device boolean or (Refs, Refs), done),
    answered in order by `settle_checks` (after a drain where a Ref's result is unread);
    uses its `programs`, `_programs`, `quiet` and `drain`."""

    def same_later(self, xs, ys, done):
        """Do two lists of arrays hold the same bytes? Compared on the device where both
        can be (one boolean crosses), else on the host; `done(bool)` is called at the next
        drain (or now, when the host decides alone). The device's boolean is copied to the
        host asynchronously: reading it inside the call (one per jit call, the values
        program checked against the script's program) made the host wait for the device
        at every step (measured on XLA:CPU: ~2-3 ms a step of jax_mlp.py, the two
        programs' own time)."""
        dev = [(x, y) for x, y in zip(xs, ys) if can_digest(x) and can_digest(y) and
               x.dtype == y.dtype and x.shape == y.shape]
        rest = [(x, y) for x, y in zip(xs, ys) if not any(x is a for a, _ in dev)]
        for x, y in rest:
            try:
                a, b = np.asarray(x), np.asarray(y)
            except Exception:   # keys, tokens: not compared
                continue
            if a.dtype != b.dtype or a.shape != b.shape or not values.same_bytes(a, b):
                done(False)
                return
        if not dev:
            done(True)
            return
        fn = self._programs.get("same")
        if fn is None:
            import jax.numpy as jnp

            fn = self._programs["same"] = self.programs.jit(lambda a, b: jnp.stack(
                [jnp.array_equal(words(p), words(q)) for p, q in zip(a, b)]).all())
        with self.quiet():
            out = fn([x for x, _ in dev], [y for _, y in dev])
        try:
            out.copy_to_host_async()
        except Exception:
            pass
        self.checks.append((out, done))
        if len(self.checks) > MAX_CHECKS:
            self.drain()

    def compare_later(self, xs, ys, done):
        """`same_later` for two lists of `Ref`s: equal dtypes, shapes and words64 hashes
        (equal hashes stand for equal bytes, docs/format.md), read at the next drain. No
        program runs: both sides were digested already (a call's outputs and its values
        program's final outputs)."""
        self.checks.append(((xs, ys), done))

    def settle_checks(self, drained=False):
        """Answer the pending checks, in the order they were asked (a drain first, when
        one compares results not read yet; a result never dispatched compares unequal)."""
        if not drained and any(type(c[0]) is tuple and any(
                r.result.host is None for r in c[0][0] + c[0][1]) for c in self.checks):
            self.drain()   # settles
            return
        checks, self.checks = self.checks, []
        for what, done in checks:
            if type(what) is tuple:
                done(all(x.result.host is not None and y.result.host is not None and
                         x.dtype == y.dtype and x.shape == y.shape and
                         self._hash(x) == self._hash(y) for x, y in zip(*what)))
                continue
            with self.quiet():
                answer = bool(np.asarray(what))
            done(answer)

    @staticmethod
    def _hash(ref):
        a, b = ref.result.host[:2]
        return values.words_finish(a[ref.index], b[ref.index], ref.nbytes)
