"""The writer's value rows stored as they come: a value's bytes go to the byte arena
(level full, under the byte cap), or its hash and statistics stay (level stats, past
the cap: statistics.py); metadata-only rows for values never stored. The recorders'
hot paths (`add_array`, `add_host_value`, `add_fetched`) write the same rows in fewer
steps; values whose bytes arrive later are reserved_values.py's.

A part of `TraceWriter` (writer/__init__.py), whose `__init__` sets the state used here:
`_rows`, `_counts`, `_blob`, `_blob_size`, `_shape_ids`, `_dtype_ids`, `level`,
`max_bytes`, `capped_at_event`, `bytes_recorded`, `digest`, `hash_name`.
"""

import math

import numpy as np

from .. import schema, values
from . import settings


class _Values:
    """Value rows whose bytes or hash are known when they are added."""

    def value_ids(self, dtype_name, storage, shape):
        """(dtype, storage, shape) string ids of a value row, for `reserve_ids`."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        return (self.intern(dtype_name), self.intern(storage), sid)

    def meta_row(self, slot, dtype_name, shape, role=schema.ROLE_OUT, name=None,
                 flags=schema.VFLAG_NOT_STORED):
        """The row `add_meta_value` appends, less its event (for `add_meta_rows`)."""
        return (slot, role, flags, *self.value_ids(dtype_name, dtype_name, tuple(shape)),
                self.intern(name), -1, 0, 0)

    def add_meta_value(self, event, slot, dtype_name, shape, *, role=schema.ROLE_OUT, name=None,
                       flags=schema.VFLAG_NOT_STORED):
        """A value whose bytes are not stored (uninitialised memory, meta tensors)."""
        self._rows["values"].append((event, *self.meta_row(slot, dtype_name, shape, role,
                                                           name, flags)))

    def add_meta_rows(self, event, rows):
        """`add_meta_value` for many values of one event whose rows were made once (a
        jitted call's arguments at every step): rows = [(slot, role, flags, dtype id,
        dtype id, shape id, name id, -1, 0, 0)] (`meta_row`)."""
        self._rows["values"].extend([(event, *row) for row in rows])

    def add_value(self, event, slot, array, *, role=schema.ROLE_OUT, name=None, flags=0,
                  logical_dtype=None, store=True, stats=None, h=None):
        """Append one value of `event`. `array` must be a host numpy array (or scalar).
        `stats`: its statistics already computed by the framework (STAT_FIELDS order),
        used when the value is kept as hash + statistics; `h`: its hash already computed
        (on the device, with this trace's hash function). A value whose bytes the blob
        holds already: `add_kept_value`.

        `store=False`: metadata only (no hash). Otherwise the bytes (level "full", under
        `max_bytes`) or the hash and statistics (level "stats", or past the cap); the
        bytes are hashed and copied once, straight from the array's buffer. Returns the
        row's hash (0 for metadata only)."""
        c, dtype_name, storage, shape = values.prepare(array, logical_dtype)
        if not store or flags & (schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED):
            flags |= schema.VFLAG_NOT_STORED if not (flags & schema.VFLAG_UNINIT) else 0
            offset, nbytes, h = -1, 0, 0
        else:
            nbytes = c.nbytes
            h = self.digest(c) if h is None else h
            offset = self._keep_bytes(event, c, nbytes)
            if offset < 0:
                flags |= schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
                if stats is None:
                    self._add_stats(c, storage, dtype_name, h=h)
                else:
                    self.stats_values += 1
                    self._rows["stats"].append((self._counts["values"] + len(self._rows["values"]),
                                                *(float(v) for v in stats[:4]), int(stats[4]),
                                                int(stats[5])))
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        self._rows["values"].append((event, slot, role, flags, self.intern(dtype_name),
                                     self.intern(storage), sid, self.intern(name), offset,
                                     nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(self._rows["values"]) >= settings.FLUSH_ROWS:
            self._auto_flush()
        return h

    def _keep_bytes(self, event, data, nbytes):
        """Append a value's bytes (a buffer, or a C-contiguous array) to the blob when the
        level and the byte cap allow: their offset, or -1 (the value keeps its hash and
        statistics; the event where the cap was reached is noted once)."""
        if self.level == "full" and (self.max_bytes is None or (
                self.capped_at_event is None and self.bytes_recorded + nbytes <= self.max_bytes)):
            offset = self._blob_size
            if nbytes:
                self._blob.append(data if isinstance(data, (bytes, bytearray, memoryview))
                                  else values.as_bytes(data))
            self._blob_size += nbytes
            self.bytes_recorded += nbytes
            return offset
        if self.level == "full" and self.capped_at_event is None:
            self.capped_at_event = int(event)
        return -1

    def add_array(self, event, slot, a, role=schema.ROLE_OUT, name_id=-1):
        """`add_value` for a host numpy array of a native dtype, stored whole (no window,
        no logical dtype): the torch recorder's hot path. Same rows and bytes as
        `add_value`; fewer Python steps (dtype and shape ids cached, no `prepare`)."""
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        dt = a.dtype
        ids = self._dtype_ids.get(dt)
        if ids is None:
            name = values._dtype_name(dt)
            if name not in values._NATIVE:
                return self.add_value(event, slot, a, role=role,
                                      name=self._strings_rev(name_id))
            ids = self._dtype_ids[dt] = (self.intern(name), name, (name, name))
        nbytes = a.nbytes
        flags = 0
        if nbytes:
            try:
                buf = a.data.cast("B")
            except (TypeError, ValueError):
                buf = a.tobytes()
        else:
            buf = b""
        h = self.digest(buf)
        rows = self._rows["values"]
        offset = self._keep_bytes(event, buf, nbytes)
        if offset < 0:
            flags = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if nbytes >= self.STATS_DIRECT_BYTES:
                self._add_stats(a, ids[1], ids[1], h=h)
            else:  # `_add_stats` inlined: a small value's bytes join its dtype's batch
                self.stats_values += 1
                p = self._pstats.get(ids[2])
                if p is None:
                    p = self._pstats[ids[2]] = self._batch(ids[2], a.itemsize or 1)
                arena = p[0]   # `arena += buf`, inlined
                start = arena.used
                p[2].append(start)
                p[3].append(nbytes)
                p[1].append(self._counts["values"] + len(rows))
                if nbytes:
                    end = start + nbytes
                    if end > len(arena.arr):
                        arena += buf
                    else:
                        arena.mem[start:end] = buf
                        arena.used = end
                    self._pstats_bytes += nbytes
                    if self._pstats_bytes >= settings.STATS_BATCH_BYTES:
                        self._reduce_stats()
        sid = self._shape_ids.get(a.shape)
        if sid is None:
            sid = self._shape_ids[a.shape] = self.intern(values.shape_str(a.shape))
        rows.append((event, slot, role, flags, ids[0], ids[0], sid, name_id, offset, nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(rows) >= settings.FLUSH_ROWS:
            self._auto_flush()

    def host_value(self, array):
        """A small host value added again and again (a jaxpr literal): prepared, interned
        and hashed once (`add_host_value`)."""
        c, dtype_name, storage, shape = values.prepare(array, None)
        return (c, dtype_name, storage, self.value_ids(dtype_name, storage, shape), c.nbytes,
                self.digest(c), bytes(values.as_bytes(c)), c.itemsize or 1)

    def add_host_value(self, event, slot, hv, role=schema.ROLE_OUT):
        """`add_value(event, slot, array, role=role)` for a `host_value`: the same row, bytes
        and statistics (queued with the other small values, as `add_value` queues them)."""
        c, dtype_name, storage, ids, nbytes, h, raw, itemsize = hv
        offset = self._keep_bytes(event, c, nbytes) if self.level == "full" else -1
        flags = 0
        rows = self._rows["values"]
        if offset < 0:
            flags = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if nbytes >= self.STATS_DIRECT_BYTES:
                self._add_stats(c, storage, dtype_name, h=h)
            else:   # `_add_stats` inlined for a small value: its bytes join its dtype's batch
                self.stats_values += 1
                p = self._pstats.get((storage, dtype_name))
                if p is None:
                    p = self._pstats[(storage, dtype_name)] = self._batch((storage, dtype_name),
                                                                          itemsize)
                pbuf = p[0]
                p[2].append(len(pbuf))
                p[3].append(nbytes)
                p[1].append(self._counts["values"] + len(rows))
                pbuf += raw
                self._pstats_bytes += nbytes
                if self._pstats_bytes >= settings.STATS_BATCH_BYTES:
                    self._reduce_stats()
        rows.append((event, slot, role, flags, *ids, -1, offset, nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(self._rows["values"]) >= settings.FLUSH_ROWS:
            self._auto_flush()

    def add_fetched(self, event, slot, ids, data, nbytes, h):
        """`add_value(event, slot, data, h=h)` for a value fetched from its device with its
        hash (a planned values program's output at level full, `ids` from `value_ids`):
        the same row and bytes, in a few steps. False, having written nothing, where a
        byte cap applies (the caller takes `add_value`, which keeps statistics past it)."""
        if self.max_bytes is not None or self.level != "full":
            return False
        self.add_fetched_row(event, slot, ids, self._keep_bytes(event, data, nbytes), nbytes, h)
        return True

    def keep_joined(self, data):
        """The blob offset of `data`, the bytes of many values fetched as one buffer
        (`add_fetched_row` rows point into it), or None where they are not kept so (no
        buffer, or a byte cap, which `add_fetched` applies value by value). `data`: a
        uint8 array nobody writes to, or a callable returning one with an `nbytes`, read
        when the flush writes it (a copy from a device still under way); held, not copied."""
        if data is None or self.max_bytes is not None or self.level != "full":
            return None
        offset = self._blob_size
        self._blob.hold(data, data.nbytes)
        self._blob_size += data.nbytes
        self.bytes_recorded += data.nbytes
        return offset

    def add_fetched_row(self, event, slot, ids, offset, nbytes, h):
        """`add_fetched`'s row for a value whose bytes are kept already at `offset`
        (`keep_joined`)."""
        self._rows["values"].append((event, slot, schema.ROLE_OUT, 0, *ids, -1, offset,
                                     nbytes, h))

    def add_kept_value(self, event, slot, dtype, shape, offset, h, role=schema.ROLE_OUT,
                       name=None):
        """`add_value(event, slot, array, h=h)`'s row, from the array's dtype and shape
        alone, for a value whose bytes the blob holds already at `offset` (`keep_joined`),
        which need not have reached the host yet."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        self._rows["values"].append((event, slot, role, 0,
                                     *self.value_ids(*values.storage_names(dt), shape),
                                     self.intern(name), offset, nbytes, h))
        if len(self._rows["values"]) >= settings.FLUSH_ROWS:
            self._auto_flush()

    def use_hash(self, name):
        """Hash this trace's values with `name` (values.DIGESTS); only before any value."""
        if name == self.hash_name:
            return True
        if self._counts["values"] or self._rows["values"] or name not in values.DIGESTS:
            return False
        self.hash_name, self.digest = name, values.DIGESTS[name]
        rec = dict(self._manifest.get("recording") or {}, hash=name)
        self.update_manifest(recording=rec)
        return True
