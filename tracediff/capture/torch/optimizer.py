"""Optimizer steps: global step pre/post hooks. Ops between them are `PHASE_OPTIM`; the
post hook writes one `KIND_OPTIM` event (`optim:Adam`) with values named
`params/<name>`, `grads/<name>`, `state/<name>/<key>` and the groups' settings, copied
with dispatch recording disabled, then counts the step and moves the --steps window."""

import threading

import numpy as np

from .. import optim_settings
from ..skipped import name as skipped_name
from ...trace import schema
from . import loaded
from .opinfo import _MAX_PARAMS, _SCALAR_TYPES, _short_repr


class _OptimizerSteps:
    """Optimizer hooks and step snapshots (a mixin of `TorchCapture`)."""

    def hook_optimizer(self, wrap):
        """(Re-)register the global optimizer step hooks, each passed through `wrap` when
        given: compiled.py wraps them in `torch._dynamo.disable`, so that a compiled
        `opt.step()` calls them eagerly (a graph break at the step's edges) instead of
        tracing them into its graph."""
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        for h in self._optim_hooks:
            h.remove()
        pre, post = self._optim_pre, self._optim_post
        if wrap is not None:
            pre_d, post_d = wrap(pre), wrap(post)
            cap, compiling = self, self._is_compiling

            # inside a `fullgraph=True` compile a graph break is an error: there the hooks
            # are traced as no-ops (that compiled step is not snapshotted)
            def pre(opt, args, kwargs):
                if cap.fullgraph_depth and compiling():
                    return None
                return pre_d(opt, args, kwargs)

            def post(opt, args, kwargs):
                if cap.fullgraph_depth and compiling():
                    return None
                return post_d(opt, args, kwargs)

        self._optim_hooks = [register_optimizer_step_pre_hook(pre),
                             register_optimizer_step_post_hook(post)]

    def _optim_pre(self, opt, args, kwargs):
        if not self.forked and threading.get_ident() == self.thread:
            self.phase = schema.PHASE_OPTIM

    def _optim_post(self, opt, args, kwargs):
        if self.forked or self.failed or threading.get_ident() != self.thread or self.writer.closed:
            return
        if self._in_window():
            try:
                self._snapshot_optimizer(opt)
            except Exception as exc:
                self._fail(exc)
        self.step += 1
        self.phase = schema.PHASE_FWD
        self._prune()
        self._update_window()

    def _snapshot_optimizer(self, opt):
        torch = loaded.torch
        names = self._param_names()
        if any(id(p) not in names for g in opt.param_groups for p in g["params"]):
            names = self._param_names(force=True)   # parameters swapped since (FSDP2)
        skipped = self.skipped_settings
        hyper = []
        for g, group in enumerate(opt.param_groups):
            for k in ("lr", "betas", "eps", "weight_decay", "momentum"):
                try:   # a setting whose repr raises is skipped, never the capture stopped
                    if k in group and not isinstance(group[k], torch.Tensor):
                        shown = _short_repr(group[k])
                        hyper.append(f"{k}={shown}" if g == 0 else f"g{g}.{k}={shown}")
                except Exception as exc:
                    skipped.add(f"group {g} {k}", exc)
        with self.lock, torch._C._DisableTorchDispatch(), torch.no_grad():
            eid = self.writer.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OPTIM,
                                        op=f"optim:{type(opt).__name__}", phase=schema.PHASE_OPTIM,
                                        origin=schema.ORIGIN_SNAPSHOT, params=", ".join(hyper)[:_MAX_PARAMS] or None,
                                        step=self.step)
            for row in optim_settings.torch_groups(opt.param_groups, skipped):
                self.writer.add_optim_setting(eid, *row)
            slot = 0
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    n = names.get(id(p), f"group{g}.param{i}")
                    self._store(eid, slot, p, name=f"params/{n}")
                    slot += 1
                    if p.grad is not None:
                        self._store(eid, slot, p.grad, name=f"grads/{n}")
                        slot += 1
                    for k, v in opt.state.get(p, {}).items():
                        try:
                            k = optim_settings.label(k)
                        except Exception as exc:   # a state key that cannot be named
                            skipped.add(f"state {skipped_name(k)}", exc)
                            continue
                        if isinstance(v, torch.Tensor):
                            self._store(eid, slot, v, name=f"state/{n}/{k}")
                        elif isinstance(v, _SCALAR_TYPES):
                            self.writer.add_value(eid, slot, np.asarray(v), name=f"state/{n}/{k}",
                                                  flags=schema.VFLAG_SCALAR)
                        else:
                            continue
                        slot += 1
