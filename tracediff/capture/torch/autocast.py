"""Autocast (mixed precision) state of a PyTorch recording: which events ran with
`torch.autocast` on, for which device type and dtype.

Read only when it changes: `torch.autocast`'s `__enter__`/`__exit__` are wrapped while the
recorder is installed, and each change opens a region of event indices; nothing is read
per op. The regions go into the manifest (`frameworks.torch.autocast`): `used` (one line,
listed by `diff/explain/env.py` when the runs differ) and `regions` ([first event, end event,
device type, dtype]; `diff/compare/dtypes.py` reads an event's state from them).
"""

MAX_REGIONS = 10000


class AutocastLog:
    def __init__(self, capture, torch):
        self.capture, self.torch = capture, torch
        self.state = {}       # device type -> dtype name, where autocast is on
        self.regions = []     # [first event, end event (exclusive) or None, device, dtype]
        self.used = set()
        self.truncated = False
        self.cls = getattr(getattr(getattr(torch, "amp", None), "autocast_mode", None),
                           "autocast", None)
        self.saved = None
        for dev in ("cpu", "cuda"):
            self._read(dev)
        if self.cls is not None:
            self.saved = (self.cls.__enter__, self.cls.__exit__)
            enter, exit_, log = self.saved[0], self.saved[1], self

            def __enter__(ctx):
                out = enter(ctx)
                log._read(getattr(ctx, "device", "cpu"))
                return out

            def __exit__(ctx, *exc):
                out = exit_(ctx, *exc)
                log._read(getattr(ctx, "device", "cpu"))
                return out

            self.cls.__enter__, self.cls.__exit__ = __enter__, __exit__

    def _read(self, device):
        torch = self.torch
        try:
            on = torch.is_autocast_enabled(device)
            dtype = str(torch.get_autocast_dtype(device)).replace("torch.", "") if on else None
        except Exception:   # a device type this torch does not know
            return
        if self.state.get(device) == dtype:
            return
        if dtype is None:
            self.state.pop(device, None)
        else:
            self.state[device] = dtype
            self.used.add(f"{device} {dtype}")
        at = self.capture.writer.n_events
        for r in self.regions:
            if r[1] is None and r[2] == device:
                r[1] = at
        if dtype is not None:
            if len(self.regions) < MAX_REGIONS:
                self.regions.append([at, None, device, dtype])
            else:
                self.truncated = True

    def uninstall(self):
        if self.saved is not None and self.cls is not None:
            self.cls.__enter__, self.cls.__exit__ = self.saved
            self.saved = None

    def manifest(self):
        end = self.capture.writer.n_events
        m = {"used": ", ".join(sorted(self.used)) or "never",
             "regions": [[r[0], end if r[1] is None else r[1], r[2], r[3]] for r in self.regions]}
        if self.truncated:
            m["regions_truncated"] = True
        return m
