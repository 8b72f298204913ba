"""A counterfactual run's substituted values (`tracediff confirm`): where no setting
expresses a source (the initialiser, the random inputs), confirm re-runs b with the other
run's recorded values in place of that source's outputs, and measures what that removes.

`TRACEDIFF_SUBSTITUTE` names a .npz written by confirm: arrays `e<event>_<slot>` and, in
`ops`, the op each event must be. When the op about to become event N is that op, its
outputs are overwritten with the arrays (in place, as the op wrote them) before the script
sees them; an event whose op, shape or dtype does not match is left alone and counted as
missed. The file is read with `allow_pickle=False`: data only. The trace says what was
substituted (the manifest's `frameworks.torch.substituted`): its values are what the script
saw, and they are not what the op computed.
"""

from __future__ import annotations

import json
import os

import numpy as np

ENV = "TRACEDIFF_SUBSTITUTE"


class Substitutions:
    def __init__(self, path):
        self.path = path
        self.by_event, self.ops = {}, {}
        with np.load(path, allow_pickle=False) as f:
            self.ops = {int(k): str(v) for k, v in json.loads(str(f["ops"])).items()}
            for key in f.files:
                if key.startswith("e") and "_" in key:
                    ev, slot = key[1:].split("_", 1)
                    self.by_event.setdefault(int(ev), {})[int(slot)] = f[key]
        self.done, self.missed = 0, []

    @classmethod
    def from_env(cls):
        path = os.environ.get(ENV)
        return cls(path) if path else None

    def apply(self, eid, op, out, torch):
        """Overwrite the outputs of the op about to be event `eid`, where it is the op the
        file names and each array fits its output."""
        arrays = self.by_event.get(eid)
        if arrays is None:
            return
        outs = [out] if isinstance(out, torch.Tensor) else \
            [x for x in out if isinstance(x, torch.Tensor)] if isinstance(out, (list, tuple)) \
            else []
        fits = op == self.ops.get(eid) and all(
            slot < len(outs) and tuple(outs[slot].shape) == a.shape and
            str(outs[slot].dtype).replace("torch.", "") == a.dtype.name
            for slot, a in arrays.items())
        if not fits:
            self.missed.append(eid)
            return
        with torch.no_grad():
            for slot, a in arrays.items():
                outs[slot].copy_(torch.from_numpy(np.ascontiguousarray(a)))
        self.done += 1

    def manifest(self):
        return {"file": os.path.basename(self.path), "events": len(self.by_event),
                "substituted": self.done, "missed": self.missed[:20],
                "note": "these events' outputs are another run's recorded values, substituted "
                        "by tracediff confirm: what the script saw, not what the ops computed"}
