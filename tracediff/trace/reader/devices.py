"""Per-device values: the device an event ran on, the per-device copies of a value
(`device_values`, as `DeviceValue`s: a sharded or replicated array's shards, or a
per-device event's own value) and where a DTensor's local shard sits (`placement`).

A part of `Trace` (reader/__init__.py).
"""

import dataclasses
from typing import Callable, Optional

import numpy as np

from ...errors import TraceError
from .. import schema, values
from .limits import MAX_DIMS


@dataclasses.dataclass(frozen=True)
class DeviceValue:
    """One device's copy of a recorded value (`Trace.device_values`): the device
    ("cpu:3"), the shard's index in the global value ("0:4,:"; "" = the whole value),
    its replica number, the hex digest of its exact bytes, and `value()` for its numbers
    (None when only the digest was stored)."""

    device: str
    shard: str
    replica: int
    digest: str
    _read: Optional[Callable] = dataclasses.field(default=None, repr=False, compare=False)

    def value(self) -> Optional[np.ndarray]:
        return self._read() if self._read is not None else None


class _DeviceValues:
    """Devices of events, per-device copies of values, DTensor placements."""

    def placement(self, event_index, slot=0, role=schema.ROLE_OUT):
        """Where value (event, slot, role) sits in its global tensor when it is one rank's
        local shard of a torch DTensor: {"placements", "mesh", "coord", "global_shape",
        "offset", "param"} (strings as recorded, untrusted; "param" None when the value
        is no parameter's), else None."""
        rows = self.placement_rows
        if not len(rows):
            return None
        hit = rows[(rows["event"] == int(event_index)) & (rows["slot"] == int(slot)) &
                   (rows["role"] == int(role))]
        if not len(hit):
            return None
        r = hit[0]
        out = {c: self.string(r[c]) if r[c] >= 0 else None for c in schema.PLACEMENT_STRINGS}
        return out

    def has_devices(self) -> bool:
        """True when the trace records any per-device event or per-device value."""
        return bool(len(self.device_rows) or len(self.shard_rows))

    def event_device(self, eid) -> str:
        """The device event `eid` ran on ("cpu:3"), "" when it is not tied to one device."""
        idx = getattr(self, "_device_index", None)
        if idx is None:
            rows = self.device_rows
            order = np.argsort(rows["event"], kind="stable")
            idx = self._device_index = (rows["event"][order], rows["device"][order])
        i = int(np.searchsorted(idx[0], int(eid)))
        return self.string(idx[1][i]) if i < len(idx[0]) and idx[0][i] == int(eid) else ""

    def device_values(self, event_index, slot=0, role=schema.ROLE_OUT) -> list:
        """Per-device values of one value of an event (output `slot` 0 unless told), as
        [DeviceValue] in recorded order (by device, then replica):

        - a global value recorded per addressable shard or replica (a sharded or
          replicated jax.Array): one DeviceValue per shard, `shard` its index in the
          global value ("0:4,:"; "" = the whole value, a replica), `replica` its replica
          number (0 = the first copy of that index);
        - an event tied to one device (a `shard_map`/`pmap` body replayed per device):
          one DeviceValue with that device, shard "" and the event's own value;
        - otherwise [] (a value not tied to devices).

        `value()` returns the numbers (None when only the digest was stored); `digest` is
        the hex xxh3-64 of the exact bytes, so equal digests mean bitwise-equal copies."""
        eid, slot, role = int(event_index), int(slot), int(role)
        if not 0 <= eid < len(self.events):
            raise IndexError(f"event {eid} is not in {self.path}")
        rows = self.value_rows(eid)
        rows = rows[(rows["slot"] == slot) & (rows["role"] == role)]
        parent = rows[0] if len(rows) else None
        idx = getattr(self, "_shard_index", None)
        if idx is None:
            order = np.argsort(self.shard_rows["event"], kind="stable")
            idx = self._shard_index = (self.shard_rows["event"][order], order)
        lo, hi = np.searchsorted(idx[0], [eid, eid + 1])
        sh = self.shard_rows[idx[1][lo:hi]]
        sh = sh[(sh["slot"] == slot) & (sh["role"] == role)]
        out = []
        for r in sh:
            out.append(DeviceValue(device=self.string(r["device"]), shard=self.string(r["index"]),
                                   replica=int(r["replica"]), digest=f"{int(r['hash']):016x}",
                                   _read=lambda r=r, p=parent: self._read_shard(r, p)))
        if not out and parent is not None:
            dev = self.event_device(eid)
            if dev:
                h = int(parent["hash"])
                out.append(DeviceValue(device=dev, shard="", replica=0,
                                       digest=f"{h:016x}" if h else "",
                                       _read=lambda p=parent: self.read_value(p)))
        return out

    def _read_shard(self, r, parent):
        """The numbers of one shards row: its own bytes, or the global value's slice."""
        if parent is None:
            return None
        if r["offset"] >= 0:
            storage = self.string(parent["storage"])
            try:
                shape = values.parse_shape(self.string(r["shape"]), MAX_DIMS)
            except ValueError as exc:
                raise TraceError(f"{self.path}: damaged trace (shard shape: {exc})") from None
            itemsize = np.dtype(storage).itemsize if storage in values._NATIVE else 0
            count = 1
            for d in shape:
                count *= d
            off, n = int(r["offset"]), int(r["nbytes"])
            if itemsize == 0 or count * itemsize != n or off + n > self.blob_size:
                raise TraceError(f"{self.path}: shard size does not match its shape and dtype")
            raw = self.stored_bytes(off, n, r["hash"])
            return values.decode(raw, self.string(parent["dtype"]), storage, shape)
        if r["flags"] & schema.SHARD_SLICE:
            whole = self.read_value(parent)
            if whole is None:
                return None
            try:
                index = values.parse_shard_index(self.string(r["index"]), whole.shape)
            except ValueError as exc:
                raise TraceError(f"{self.path}: damaged trace ({exc})") from None
            return np.ascontiguousarray(whole[index])
        return None
