"""Cross-checks of a loaded trace's rows (vectorised; milliseconds for millions of rows):
every string, event and producer a row refers to exists, rows of events past the last
commit are dropped, every stored value lies inside the committed bytes with exactly
shape x itemsize bytes, and every shard's index agrees with its shape.

A part of `Trace` (reader/__init__.py), run by `_load` (loading.py).
"""

import numpy as np

from ...errors import TraceError
from .. import schema, values
from .limits import MAX_DIMS


class _Checks:
    """`_check_tables` and the shard checks it runs."""

    def _check_tables(self):
        """Cross-checks of the tables (vectorised; milliseconds for millions of rows)."""
        n_ev, n_str = len(self.events), len(self.strings)
        bad = lambda what: TraceError(f"{self.path}: damaged trace ({what})")  # noqa: E731
        e = self.events
        for col in ("op", "params", "name_stack", "source", "node"):
            if len(e) and ((e[col] < -1) | (e[col] >= n_str)).any():
                raise bad(f"events.{col} refers to a string that does not exist")
        for col in ("call", "parent"):
            if len(e) and ((e[col] < -1) | (e[col] >= n_ev)).any():
                raise bad(f"events.{col} refers to an event that does not exist")
        # Value and input rows of events past the last commit (writer killed) are dropped.
        self.values = self.values[(self.values["event"] >= 0) & (self.values["event"] < n_ev)]
        self.inputs = self.inputs[(self.inputs["event"] >= 0) & (self.inputs["event"] < n_ev)]
        v = self.values
        for col in ("dtype", "storage", "shape", "name"):
            if len(v) and ((v[col] < -1) | (v[col] >= n_str)).any():
                raise bad(f"values.{col} refers to a string that does not exist")
        src = self.source_rows
        for col in ("source", "lines", "sha256"):
            if len(src) and ((src[col] < -1) | (src[col] >= n_str)).any():
                raise bad(f"sources.{col} refers to a string that does not exist")
        self.device_rows = self.device_rows[(self.device_rows["event"] >= 0) &
                                            (self.device_rows["event"] < n_ev)]
        if len(self.device_rows) and ((self.device_rows["device"] < -1) |
                                      (self.device_rows["device"] >= n_str)).any():
            raise bad("devices.device refers to a string that does not exist")
        self._check_shards(bad, n_ev, n_str)
        pl = self.placement_rows
        pl = self.placement_rows = pl[(pl["event"] >= 0) & (pl["event"] < n_ev)]
        for col in schema.PLACEMENT_STRINGS:
            if len(pl) and ((pl[col] < -1) | (pl[col] >= n_str)).any():
                raise bad(f"placements.{col} refers to a string that does not exist")
        os_ = self.optim_setting_rows
        os_ = self.optim_setting_rows = os_[(os_["event"] >= 0) & (os_["event"] < n_ev)]
        for col in schema.OPTIM_SETTING_STRINGS:
            if len(os_) and ((os_[col] < -1) | (os_[col] >= n_str)).any():
                raise bad(f"optim_settings.{col} refers to a string that does not exist")
        i = self.inputs
        if len(i) and ((i["producer"] < schema.PRODUCER_CONST) | (i["producer"] >= n_ev)).any():
            raise bad("inputs.producer refers to an event that does not exist")
        # Every shape must parse; every stored value must lie inside the committed bytes
        # and hold exactly shape x itemsize bytes of a dtype numpy knows.
        shapes = {}
        for idx in np.unique(v["shape"]).tolist() if len(v) else ():
            try:
                dims = values.parse_shape(self.string(idx), MAX_DIMS)
            except ValueError as exc:
                raise bad(f"value shape: {exc}") from None
            count = 1
            for d in dims:
                count *= d
            shapes[idx] = count
        stored = v[(v["offset"] >= 0) & ((v["flags"] & (schema.VFLAG_NOT_STORED |
                                                         schema.VFLAG_UNINIT)) == 0)]
        if not len(stored):
            return
        if ((stored["nbytes"] < 0) | (stored["offset"] > self.blob_size - stored["nbytes"])).any():
            raise bad("value bytes lie outside the stored data")
        itemsize = {}
        for idx in np.unique(stored["storage"]).tolist():
            name = self.string(idx)
            if name not in values._NATIVE:
                raise bad(f"unknown storage dtype {name[:40]!r}")
            itemsize[idx] = np.dtype(name).itemsize
        pairs = np.unique(np.stack([stored["shape"].astype(np.int64),
                                    stored["storage"].astype(np.int64),
                                    stored["nbytes"]], axis=1), axis=0)
        for shape_idx, storage_idx, nbytes in pairs.tolist():
            if shapes[shape_idx] * itemsize[storage_idx] != nbytes:
                raise bad("a value's size does not match its shape and dtype")

    def _check_shards(self, bad, n_ev, n_str):
        """Shard rows: of committed events, strings that exist, a replica number >= 0,
        own bytes inside the committed bytes (sizes against shapes are checked when read)."""
        sh = self.shard_rows
        sh = self.shard_rows = sh[(sh["event"] >= 0) & (sh["event"] < n_ev)]
        if not len(sh):
            return
        for col in ("device", "index", "shape"):
            if ((sh[col] < -1) | (sh[col] >= n_str)).any():
                raise bad(f"shards.{col} refers to a string that does not exist")
        if (sh["replica"] < 0).any() or (sh["role"] > schema.ROLE_IN).any():
            raise bad("shards: invalid replica or role")
        own = sh[sh["offset"] >= 0]
        if len(own) and ((own["nbytes"] < 0) | (own["offset"] > self.blob_size - own["nbytes"])).any():
            raise bad("shard bytes lie outside the stored data")
        # every index is well formed (bounded before it is parsed) and agrees with the
        # shard's own shape where it names both ends: a malformed index would otherwise
        # pair with nothing in the other trace and its difference go unseen
        pairs = np.unique(np.stack([sh["index"].astype(np.int64), sh["shape"].astype(np.int64)],
                                   axis=1), axis=0)
        for idx, shp in pairs.tolist():
            text = self.string(idx)
            try:
                parts = values.shard_index_parts(text, MAX_DIMS)
                dims = values.parse_shape(self.string(shp), MAX_DIMS) if parts else ()
            except ValueError as exc:
                raise bad(f"shards: {exc}") from None
            if len(parts) > len(dims) or any(
                    (lo or 0) > hi or (hi - (lo or 0)) != d
                    for (lo, hi), d in zip(parts, dims) if hi is not None):
                raise bad(f"shards: shard index {text[:40]!r} does not match the shard's "
                          f"shape {tuple(dims)}")
        self._check_shard_extents(bad, sh)

    def _check_shard_extents(self, bad, sh):
        """A shard's open index parts (`:`, `A:`) run to the end of the global value's
        dimension: the shard's own extent there must be what is left of it. An index
        rewritten to `:,:` on a smaller shard would otherwise read as the whole value and
        hide a difference (each device's copy compared as if it were the global one)."""
        v = self.values
        v = v[np.isin(v["event"], np.unique(sh["event"]))]
        keys = {(int(e), int(sl), int(r)): int(shp) for e, sl, r, shp in
                zip(v["event"].tolist(), v["slot"].tolist(), v["role"].tolist(),
                    v["shape"].tolist())}
        seen = set()
        for row in sh:
            g = keys.get((int(row["event"]), int(row["slot"]), int(row["role"])))
            trip = (int(row["index"]), int(row["shape"]), g)
            if g is None or trip in seen:
                continue
            seen.add(trip)
            try:
                parts = values.shard_index_parts(self.string(trip[0]), MAX_DIMS)
                dims = values.parse_shape(self.string(trip[1]), MAX_DIMS)
                full = values.parse_shape(self.string(g), MAX_DIMS)
            except ValueError as exc:
                raise bad(f"shards: {exc}") from None
            if parts and len(parts) == len(dims) == len(full) and any(
                    hi is None and d != f - (lo or 0)
                    for (lo, hi), d, f in zip(parts, dims, full)):
                raise bad(f"shards: shard index {self.string(trip[0])[:40]!r} does not match "
                          f"the shard's shape {tuple(dims)} in a value of shape {tuple(full)}")
