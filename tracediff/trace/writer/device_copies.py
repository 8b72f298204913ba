"""Per-device copies of a recorded value (the `shards` table: a sharded or replicated
jax.Array's addressable shards, stored only where they differ from the global value's
slice) and where a DTensor's local shard sits in its global tensor (`placements`).

A part of `TraceWriter` (writer/__init__.py).
"""

from .. import schema, values


class _DeviceCopies:
    """Shard rows of a value just added, and DTensor placements."""

    def add_shard(self, event, slot, array, *, device, index, replica, whole=None,
                  role=schema.ROLE_OUT, logical_dtype=None):
        """Append one per-device copy of a value just added (same event, slot, role).

        `index`: the shard's place in the global value as a tuple of slices (() or all
        full slices: the whole value); `whole`: the global host array as stored in
        `values`, or None. A shard equal to `whole[index]` is marked SHARD_SLICE and its
        bytes are not stored twice; a differing shard's bytes are stored (level full,
        under the byte cap), else only its hash (SHARD_DIGEST)."""
        c, _dtype_name, _storage, shape = values.prepare(array, logical_dtype)
        h = self.digest(c)
        text = values.shard_index_text(index)
        flags, offset, nbytes = 0, -1, 0
        same = False
        if whole is not None:
            # the digest of the global value's slice, once per index of this value (a
            # replicated array has 8 copies of one index on 8 devices)
            cache = self._slice_digests
            if cache.get("whole") is not whole:
                cache.clear()
                cache["whole"] = whole
            expected = cache.get(text)
            if expected is None:
                try:
                    part = values.prepare(whole[tuple(index)] if text else whole, logical_dtype)[0]
                    expected = cache[text] = (part.shape, part.dtype, self.digest(part))
                except Exception:   # an index the global value does not take: compared by hash
                    expected = cache[text] = ()
            same = expected == (c.shape, c.dtype, h)
        if same:
            flags = schema.SHARD_SLICE
        elif self.level == "full" and (self.max_bytes is None or (
                self.capped_at_event is None and self.bytes_recorded + c.nbytes <= self.max_bytes)):
            offset, nbytes = self._blob_size, c.nbytes
            if nbytes:
                self._blob.append(values.as_bytes(c))
            self._blob_size += nbytes
            self.bytes_recorded += nbytes
        else:
            flags = schema.SHARD_DIGEST
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        self._rows["shards"].append((event, slot, role, flags, self.intern(device),
                                     self.intern(text), int(replica), sid, offset, nbytes, h))

    def forget_slices(self):
        """Drop the global value add_shard compared against (do not keep it alive)."""
        self._slice_digests.clear()

    def add_placement(self, event, slot, role, placements, mesh, coord, global_shape, offset,
                      param=None):
        """Where value (event, slot, role), one rank's local shard of a DTensor, sits in
        the global tensor (strings as the `placements` table documents them)."""
        s = self.intern
        self._rows["placements"].append((int(event), int(slot), int(role), s(placements),
                                         s(mesh), s(coord), s(global_shape), s(offset),
                                         s(param)))
