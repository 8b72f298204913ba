"""The values of one values-program run hashed on their device (probe.py's `Prober.record`).

At level stats their rows are reserved while the call's events are written and filled from
the program's packed result, or from the group programs' results (digest_groups.py), read
asynchronously at the next drain; at level full the program, or the group programs after it,
hashed them, and the program joined the small ones into one buffer (`DeviceDigests.fetched`).
"""

import math

import numpy as np

from ...trace import schema
from . import digest_results


class Digested:
    """The values of one values-program run hashed on the device: at level stats their
    rows are reserved and filled from the packed result (read asynchronously, at the next
    drain); at level full they were hashed (by the program or by group programs after
    it) and the small ones joined into one buffer, brought to the host by
    `DeviceDigests.fetched` (one copy), the others returned as arrays."""

    def __init__(self, cap, mask, packed, found, full_meta=None):
        """packed: the values program's digests (level stats), or at level full (its
        lanes, or the group programs' (outputs, take); its joined buffer) with `full_meta`
        = ((shape, dtype), byte count, byte offset in the joined buffer or None) per
        digested value, and the program joining the small ones."""
        self.cap, self.mask = cap, iter(mask)
        self.full = cap.session.writer.level == "full"
        self.reserve = cap.digests.reserve
        self.at = 0                   # the next digested value's place in the result
        if self.full:
            self.result = digest_results.Result()
        elif type(packed) is tuple:   # group programs' outputs, and their rows' order
            self.result = digest_results.Result(packed[0], take=packed[1])
        else:
            self.result = digest_results.Result(packed)
        self.rows = self.result.rows
        if self.full:
            avals, nbytes, self.starts = full_meta[:3]
            rest = [x for x, m in zip(found, mask) if m and x is not None]
            self.hashes, self.joined = cap.digests.fetched(nbytes, *packed, rest)
            self.avals = avals
            self.at_full = 0
            self.kept_at = None       # the joined buffer's blob offset, once kept whole
            self.kept_alone = {}      # value -> blob offset of a value kept on its own

    def take(self, eid, slot, var, x, keep):
        """Record one found value if it was digested: its `Ref` (its `Fetched` at level
        full); False: the caller stores it."""
        if not next(self.mask):
            return False
        if self.full:
            got = self.fetched_at(self.at_full, x)
            self.at_full += 1
            self.cap.store(eid, slot, got.value, store=keep, h=got.h)
            return got
        aval = var.aval
        if keep:
            handle, nbytes = self.reserve(eid, slot, aval, schema.ROLE_OUT)
        else:   # outside an --ops/--modules window: shape and dtype only
            self.cap.session.writer.add_meta_value(eid, slot, str(aval.dtype),
                                                   tuple(aval.shape), role=schema.ROLE_OUT)
            handle, nbytes = None, math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        self.rows.append((handle, nbytes))
        self.at += 1
        return digest_results.Ref(self.result, self.at - 1, aval.dtype, tuple(aval.shape), nbytes)

    def fetched_at(self, i, x):
        """Level full: value `i` of the fetched ones as a `Fetched` (x: its array), or x
        itself where i is None (a final output that is no equation's value)."""
        if i is None:
            return x
        host = self.host(i)
        if host is None:
            return digest_results.Fetched(x, self.hashes[i], self.kept_alone.get(i))
        kept = None if self.kept_at is None else self.kept_at + self.starts[i]
        return digest_results.Fetched(host, self.hashes[i], kept)

    def host(self, i):
        """Level full: digested value i's bytes on the host (a `HostView`, read when asked),
        or None where it was not joined (a planned call writes most of them as the buffer,
        its rows pointing into it)."""
        at = self.starts[i]
        if at is None:
            return None
        shape, dtype = self.avals[i]
        return digest_results.HostView(self.joined, at, dtype, shape)

    def ref(self, i, aval):
        """The `Ref` of value `i` of the packed result (a final output of the program)."""
        nbytes = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        while len(self.rows) <= i:    # outputs digested after the equations' values
            self.rows.append((None, 0))
        return digest_results.Ref(self.result, i, aval.dtype, tuple(aval.shape), nbytes)

    def done(self):
        if not self.full:
            self.cap.digests.adopt_result(self.result)
