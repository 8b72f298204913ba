"""Value rows reserved now and completed later: a device tensor copied to the host
asynchronously, or hashed on its device, has its row appended at once (its place in the
trace) and its bytes, hash and statistics filled before the flush that writes it
(`flush_hooks` run first; `held()` keeps automatic flushes out meanwhile).

A part of `TraceWriter` (writer/__init__.py); rows are handles into `_rows["values"]`.
"""

from .. import schema, values


class _ReservedValues:
    """Reserve value rows (`reserve_*`), then complete them (`fill_*`)."""

    def reserve_value(self, event, slot, dtype_name, storage, shape, *, role=schema.ROLE_OUT,
                      name=None, logical=None):
        """Append a value row whose bytes, hash (and statistics) arrive later through
        `fill_value` (a device tensor copied to the host asynchronously); returns a
        handle. Must be filled before the next flush ends: `flush_hooks` run first."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        rows = self._rows["values"]
        rows.append((event, slot, role, 0, self.intern(logical or dtype_name),
                     self.intern(storage), sid, self.intern(name), -1, 0, 0))
        return len(rows) - 1

    def reserve_ids(self, event, slot, role, ids, name_id=-1):
        """`reserve_value` with the row's string ids already made (`value_ids`)."""
        rows = self._rows["values"]
        rows.append((event, slot, role, 0, *ids, name_id, -1, 0, 0))
        return len(rows) - 1

    def reserve_rows(self, event, role, ids):
        """`reserve_ids` for slots 0.. of one event: ids = [(string ids, name id)]; returns
        the first row's handle (the others follow it)."""
        rows = self._rows["values"]
        first = len(rows)
        rows.extend([(event, slot, role, 0, *i, name_id, -1, 0, 0)
                     for slot, (i, name_id) in enumerate(ids)])
        return first

    def fill_value(self, handle, c, storage, logical, stats=None):
        """Complete a reserved row with the host bytes `c` (C-contiguous, storage dtype):
        hash, and bytes (full level, under the cap) or statistics (`stats`: a tuple in
        `values.STAT_FIELDS` order, computed on the device; else computed here)."""
        rows = self._rows["values"]
        row = rows[handle]
        nbytes = c.nbytes
        buf = values.as_bytes(c)
        h = self.digest(buf)
        flags = row[3]
        offset = self._keep_bytes(row[0], buf, nbytes)
        if offset < 0:
            flags |= schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if stats is None:
                self._add_stats(c, storage, logical, row=self._counts["values"] + handle, h=h)
            else:
                self.stats_values += 1
                self._rows["stats"].append((self._counts["values"] + handle, *stats[:4],
                                            int(stats[4]), int(stats[5])))
        rows[handle] = row[:3] + (flags,) + row[4:8] + (offset, nbytes, h)

    def fill_digest(self, handle, nbytes, h, stats=None):
        """Complete a reserved row with a value's hash (and statistics, STAT_FIELDS order)
        computed on its device: no bytes cross (levels stats and calls)."""
        rows = self._rows["values"]
        row = rows[handle]
        flags = row[3] | schema.VFLAG_NOT_STORED
        if stats is not None:
            flags |= schema.VFLAG_STATS
            self.stats_values += 1
            self._rows["stats"].append((self._counts["values"] + handle, *stats[:4],
                                        int(stats[4]), int(stats[5])))
        rows[handle] = row[:3] + (flags,) + row[4:8] + (-1, int(nbytes), int(h))

    def fill_digests(self, rows, hashes, floats=None, counts=None):
        """`fill_digest` for many reserved rows: rows = [(handle or None, nbytes)], with
        their hashes and (levels stats/calls) statistics' floats and counts."""
        vrows = self._rows["values"]
        base = self._counts["values"]
        if floats is None:
            flag = schema.VFLAG_NOT_STORED
            for (handle, nbytes), h in zip(rows, hashes):
                if handle is not None:
                    row = vrows[handle]
                    vrows[handle] = (*row[:3], row[3] | flag, *row[4:8], -1, nbytes, h)
            return
        flag = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
        srows = self._rows["stats"]
        n = 0
        for (handle, nbytes), h, f, c in zip(rows, hashes, floats, counts):
            if handle is not None:
                row = vrows[handle]
                vrows[handle] = (*row[:3], row[3] | flag, *row[4:8], -1, nbytes, h)
                srows.append((base + handle, *f, *c))
                n += 1
        self.stats_values += n
