"""optax steps: the optimizer's grads, params, updates and state as one event a step.

optax_tags.py wraps every `GradientTransformation.update` once optax is imported; the
outermost update of a step tags its values (`name` equations), which the recorder
collects during replay or eagerly (`_pending_optim`) and writes as one `optim:optax`
event with the optimizer's settings (`flush_optim`). At `--level calls` and outside a
`--steps` window the steps are only counted: a call whose jaxpr holds the tags is one
(`_has_optax`).
"""

import contextlib

from ...trace import schema
from .. import optim_settings
from . import internals, optax_tags
from .dispatch import this_thread
from .optax_tags import OPTAX_TAG


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


class _Optimizer:
    """JaxCapture's optimizer steps (optax)."""

    @contextlib.contextmanager
    def optax_update(self):
        """Bracket one optax `update` call (optax_tags wraps every transformation's).
        Yields True for the outermost update of an active session: the one whose grads,
        params, updates and state are tagged as the optimizer step."""
        outer = this_thread.optax_depth == 0 and self.session is not None and self.session.active
        this_thread.optax_depth += 1
        try:
            yield outer
        finally:
            this_thread.optax_depth -= 1

    def optax_settings(self, update):
        """Keep the settings of the outermost optax update being called (its closures,
        `optim_settings.optax_settings`), written with every step after it: a jitted step
        calls `update` once, while tracing."""
        try:   # a setting that cannot be read is skipped (`skipped_settings`), not all
            self._optax_settings = optim_settings.optax_settings(update, self.skipped_settings)
        except Exception as exc:   # never fail the program for its settings
            self._optax_settings = []
            self.skipped_settings.add("optax update", exc)

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

    def _has_optax(self, closed):
        """Does this call's jaxpr (at any depth) hold optax step tags? (cached)"""
        hit = self._optax_calls.get(id(closed))
        if hit is not None and hit[0] is closed:
            return hit[1]
        found = _jaxpr_has_tag(getattr(closed, "jaxpr", closed), 0)
        self._optax_calls[id(closed)] = (closed, found)
        return found

    def _patch_optax(self):
        self._optax_patch = optax_tags.install(self)

    def _unpatch_optax(self):
        patch = getattr(self, "_optax_patch", None)
        if patch is not None:
            patch.uninstall()
            self._optax_patch = None
