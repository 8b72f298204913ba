"""Why a parameter's optimizer state or step differs where its grads match: the optimizer's
settings (recorded in the trace's `optim_settings` table, read under one set of names by
`align/optsettings.py`), with the value on each side, or else the optimizer's step itself.

Why: a finding that says "the divergence is upstream (the forward or backward pass)" where the
grads were compared and agree sends the user to the wrong half of the program.
"""

import numpy as np

from ...trace.values import has_bytes as comparable
from ..align import optsettings


class OptimizerCause:
    """The settings part of `RoleSteps` (mixed into `CrossDiffer`)."""

    def _settings_of(self, ea, eb, pname):
        """({setting: Setting} of each side for parameter `pname`, or None where that side
        recorded none): torch's from the param group holding it, optax's from its closures
        and `inject_hyperparams` state (`align/optsettings.py`)."""
        out = []
        for t, reader, e, fw in ((self.ta, self.ra, ea, self._fw_name(self.fw_a)),
                                 (self.tb, self.rb, eb, self._fw_name(self.fw_b))):
            rows = t.optim_settings(e) if hasattr(t, "optim_settings") else []
            named = self._named(t, e)
            if fw == "torch":
                names = [k[len("params/"):] for k in named if k.startswith("params/")]
                out.append(optsettings.torch_side(rows, names, pname) if rows else None)
                continue
            hyper = {}
            for k, r in named.items():
                if k.startswith(optsettings.HYPER_PREFIX) and comparable(r):
                    x = np.asarray(reader.read(r))
                    if x.size == 1 and x.dtype.kind in "fiub":
                        hyper[k[len(optsettings.HYPER_PREFIX):]] = float(x.reshape(-1)[0])
            out.append(optsettings.optax_side(rows, hyper) if rows or hyper else None)
        return out

    def _optimizer_cause(self, res, ea, eb):
        """Why a parameter's optimizer state or step differs where its grads match: the
        settings that differ (with both values, `res.settings`), else the step itself."""
        sa, sb = self._settings_of(ea, eb, res.parameter)
        res.settings_recorded = sa is not None and sb is not None
        if not res.settings_recorded:
            missing = " and ".join(s for s, x in (("a", sa), ("b", sb)) if x is None)
            return (f"the optimizer's step itself differs: its settings or its implementation "
                    f"(settings not recorded on {missing})")
        diffs = optsettings.differences(sa, sb)
        res.settings = [{"setting": k, "a": x.text, "b": y.text} for k, x, y in diffs]
        if diffs:
            return f"the optimizer's settings differ: {optsettings.describe(diffs)}"
        return (f"the optimizer's step itself differs, its settings agree where both sides "
                f"recorded them ({', '.join(optsettings.compared(sa, sb)) or 'none'}): its "
                f"implementation, or a setting not recorded")

    def _decay_settings(self, res, ea, eb):
        """'; the settings of P: weight_decay 0.1 vs 0.0 (b: param group 1)' where the
        sides' weight-decay settings for the parameter differ; where they agree but one
        side decays under a mask, that; '' where nothing was recorded."""
        sa, sb = self._settings_of(ea, eb, res.parameter)
        res.settings_recorded = sa is not None and sb is not None
        if not res.settings_recorded:
            return ""
        diffs = optsettings.differences(sa, sb)
        res.settings = [{"setting": k, "a": x.text, "b": y.text} for k, x, y in diffs]
        if diffs:
            return f"; the settings of {res.parameter}: {optsettings.describe(diffs)}"
        masked = [(side, x["weight_decay"]) for side, x in (("a", sa), ("b", sb))
                  if "weight_decay" in x and x["weight_decay"].where]
        return "".join(f"; {side} decays with weight_decay {x.text} {x.where}"
                       for side, x in masked)
