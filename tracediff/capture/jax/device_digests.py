"""Hashes and statistics of JAX values computed where the values are (issue 37).

On an accelerator, copying every value to the host to hash and summarise it there costs
more than anything else (a 4096-wide MLP's Adam step: 14 GB of intermediates, 21
CPU-seconds a step on a TPU v5e's host). Here XLA computes, on the value's device, the
words64 hash of its exact bytes (trace/values.py: the very function numpy computes for
values already on the host, so traces from two backends compare hash to hash) and its
statistics (`values.STAT_FIELDS`), packed into 12 uint32 words a value: inside the values
program of a call (`--jax-values compiled`, probe.py), or, for a call's own inputs and
outputs and eager values, by one small jitted program per dtype and shape run as the value
is recorded. Only those words are copied to the host, asynchronously, and the writer's
reserved rows are filled when they are read (`drain`: at a flush, or when many are
pending). At level full the values are hashed from the arrays themselves, and the small
ones joined into one buffer for the host (`fetch_parts`): inside a values program, from
its values past an optimization barrier (probe), else by one program over the arrays
(`DeviceDigests.fetch`).

The same code runs on XLA:CPU (`record --hash words64`; tests/test_jax_digest.py), where
it is slower than hashing on the host (xxh3), so the CPU default stays xxh3_64. Here lives
`DeviceDigests`, which runs them for a recording; the traced programs are in
digest_programs.py, what is digested and what comes back in digest_results.py.
"""

import contextlib
import math

import numpy as np

from ...trace import values
from .digest_checks import SameLater
from .digest_groups import DigestGroups, enabled, group_key
from .digest_programs import fetch_parts, packed
from .digest_results import (WORDS, HostView, Joined, Ref, Result, dtype_ok, finish_all,
                             joined, joined_starts, rows_of, storage_of, unpack_all)

MAX_PENDING = 4096          # results not yet read


def one_device(xs):
    """The device every array of xs is committed to alone (Python scalars aside), or
    None."""
    device = None
    try:
        for x in xs:
            sharding = getattr(x, "sharding", None)
            if sharding is None and not hasattr(x, "shape"):
                continue
            devs = sharding.device_set
            if len(devs) != 1:
                return None
            d = next(iter(devs))
            if device is None:
                device = d
            elif d != device:
                return None
    except Exception:
        return None
    return device


class DeviceDigests(SameLater):
    """The values of one recording hashed on their device (callers hold the
    session's lock and run with tracediff's own JAX work unrecorded)."""

    def __init__(self, writer, quiet, programs):
        self.writer = writer
        self.programs = programs      # program_cache.ProgramCache: compiled once a machine
        self.quiet = quiet            # context manager: tracediff's JAX work, not recorded
        self.with_stats = writer.level != "full"
        self.pending = []             # Results dispatched, not yet read
        self.values = self.batches = 0
        self._batch = None            # values of a call's outputs, run as one program
        self._batch_result = None     # ... and the Result they will fill
        self._programs = {}
        self.checks = []              # `same_later` / `compare_later` answers to read
        self._ids = {}                # (dtype, shape, logical) -> (row string ids, nbytes)
        self._keys = set()            # rows of PRNG key data not yet filled
        # values programs' values and calls' outputs digested by group programs, compiled
        # once per dtype and shape (digest_groups.py); None: inside each program, as before
        self.groups = DigestGroups(programs, quiet) if enabled() else None
        writer.flush_hooks.append(self.drain)

    def add(self, eid, slot, x, role, name, logical=None):
        """Reserve the row of a value (stats/calls levels: no bytes will cross) and run its
        program now (`can_digest`); its 12 words are copied to the host asynchronously.
        One program per dtype and shape, not per batch: a batch's signature changes with
        what a call stores (its first call stores its arguments, later ones not), and each
        new one was a compile inside the script's timed loop. Returns the value's `Ref`."""
        handle, nbytes = self.reserve(eid, slot, x, role, name, logical)
        if logical is not None and logical.startswith("key<"):
            self._keys.add(handle)    # PRNG key data: counts only, as on the host
        if self._batch is not None:
            res = self._batch_result
            self._batch.append(x)
            res.rows.append((handle, nbytes))
            return Ref(res, len(res.rows) - 1, x.dtype, tuple(x.shape), nbytes)
        device = None if self.groups is None else one_device((x,))
        if device is not None:   # the groups' program of one value, compiled in background
            res = Result(None, [(handle, nbytes)])
            with self.quiet():
                self.groups.digest([x], device, self.with_stats, res)
            self._adopt(res)   # read at a drain, once it has run
        else:
            with self.quiet():
                out = self._program(self.with_stats)(x)
            res = self.adopt(out, [(handle, nbytes)])
        if len(self.pending) > MAX_PENDING:
            self.drain()
        return Ref(res, 0, x.dtype, tuple(x.shape), nbytes)

    def prepare(self, avals, args):
        """Start compiling the group programs that a call's outputs (of these avals) will
        take, before the call runs: they compile in background threads while JAX compiles
        the script's program (on a TPU v5e a 4096-wide MLP step's outputs' programs took
        4.2 s of the script's thread at its first call, and its initialiser's 5.2 s)."""
        if self.groups is None:
            return
        keep = [a for a in avals if hasattr(a, "shape") and dtype_ok(a.dtype)]
        device = one_device(args) if keep else None
        if device is not None:
            self.groups.prepare([group_key(a) for a in keep], device, self.with_stats)

    def add_rows(self, xs, first, nbytes):
        """`add` for values whose rows are reserved already, one after another from handle
        `first` (a call's outputs: `TraceWriter.reserve_rows`), run as one program."""
        self._run_batch(list(xs), Result(None, [(first + i, n) for i, n in enumerate(nbytes)]))

    def add_ref(self, eid, slot, ref, role, name=None):
        """A row for a value already digested (`Ref`): filled from its result, now if it
        was read already, else at the drain that reads it. No program runs."""
        handle, nbytes = self.reserve(eid, slot, ref, role, name)
        res = ref.result
        if res.host is not None:
            self._fill(handle, nbytes, res.host, ref.index)
        else:
            res.extra.append((handle, nbytes, ref.index))
        self.values += 1

    @contextlib.contextmanager
    def outputs(self):
        """The values added inside run as one program (a call's outputs, an optimizer
        step's values: the same dtypes and shapes at every step, one compile; one dispatch
        instead of one a value, measured ~0.25 ms each on a TPU v5e)."""
        if self._batch is not None:   # inside another batch (a call's optimizer step): one
            yield
            return
        self._batch, self._batch_result = [], Result()
        with self.writer.held():    # the batch's rows stay reserved until it has run
            try:
                yield
            finally:
                batch, res = self._batch, self._batch_result
                self._batch = self._batch_result = None
                if batch:
                    self._run_batch(batch, res)

    def _run_batch(self, batch, res):
        """One program for a batch of values filling `res`; one program a value where the
        batch cannot be one (values committed to different devices)."""
        ws = self.with_stats
        device = None if self.groups is None else one_device(batch)
        if device is not None:   # the programs of the values programs' groups, shared
            try:
                self.groups.digest(batch, device, ws, res)
                self._adopt(res)
                return
            except Exception:
                pass
        fn = self._programs.get(("batch", ws))
        if fn is None:
            fn = self._programs[("batch", ws)] = self.programs.jit(lambda xs: packed(xs, ws))
        try:
            with self.quiet():
                out = fn(batch)
        except Exception:
            out = self._one_by_one(batch)
        res.out = out
        self._adopt(res)

    def _one_by_one(self, batch):
        outs = []
        for x in batch:
            with self.quiet():
                outs.append(self._program(self.with_stats)(x))
        return outs

    def _program(self, with_stats):
        fn = self._programs.get(with_stats)
        if fn is None:
            fn = self._programs[with_stats] = self.programs.jit(
                lambda x: packed([x], with_stats))
        return fn

    def fetch(self, xs, copy=True, wait=True):
        """Level full: [(words64 hash, bytes on the host or None)] of arrays on their
        device, by one program for all of them (a call's outputs, an optimizer step's
        values: one dispatch and one read, not one a value) that also joins the small
        ones' words into one buffer (`fetch_parts`): one copy to the host for those, read
        as `HostView`s when first asked; the others' copies are started here and left to
        the caller (None). The hashes are of the arrays given, not of a recomputation.
        copy=False: no copy starts (the caller expects to need the hashes only).
        wait=False (an eager value): [(None, None)] where a group program they need is not
        compiled yet (the caller hashes them on the host)."""
        device = None if self.groups is None else one_device(xs)
        if not wait and device is not None and \
                not self.groups.ready(xs, device, with_stats=False):
            # hashed on the host meanwhile (the bytes cross at this level anyway), while
            # their programs compile in the background: a model's eager initialiser no
            # longer waits for a program per new shape (on a TPU ~1-3 s each)
            self.groups.host_hashed += len(xs)
            return [(None, None)] * len(xs)
        avals = [(x.shape, x.dtype) for x in xs]
        small = tuple(joined(avals))
        with self.quiet():
            if device is None:   # one program hashes them all and joins the small ones
                fn = self._programs.get(("fetch", small))
                if fn is None:
                    fn = self._programs[("fetch", small)] = self.programs.jit(
                        lambda xs: fetch_parts(xs, small))
                lanes, flat = fn(list(xs))
            else:   # hashed by the group programs (compiled once per dtype and shape, not
                # once per signature: on a TPU each value's hash costs a program ~0.2 s to
                # compile), the small ones joined by a program that only copies
                alone = [x for x, j in zip(xs, small) if j]
                flat = self.groups.join_now(alone) if alone else None
                lanes = self.groups.run(list(xs), device, with_stats=False)
        hashes, data = self.fetched([x.nbytes for x in xs], lanes, flat,
                                    [x for x, j in zip(xs, small) if not j and copy], copy)
        return [(h, None if at is None else HostView(data, at, dtype, shape))
                for h, at, (shape, dtype) in zip(hashes, joined_starts(avals, small), avals)]

    def fetched(self, nbytes, lanes, flat, rest, copy=True):
        """(words64 hashes, the joined buffer as a `Joined`, or None) from `fetch_parts`'
        results (lanes, joined words) of values of these byte counts, computed in some
        program (`fetch`'s, or a values program's), `rest` the values not joined, whose
        copies start here. Waits for the hashes only: the joined bytes are read when first
        needed (`HostView`, `Joined`)."""
        for x in rest:
            try:
                x.copy_to_host_async()
            except Exception:
                pass
        with self.quiet():
            joined = Joined(flat, copy) if flat is not None else None
            # a values program's group programs' (outputs, take), or one program's lanes
            lanes = rows_of(lanes[0], 2, lanes[1]) if type(lanes) is tuple else \
                np.asarray(lanes)
        self.values += len(nbytes)
        self.batches += 1
        a, b, _, _ = unpack_all(lanes, False)
        return finish_all(a, b, nbytes).tolist(), joined

    def adopt(self, out, rows):
        """A packed result computed elsewhere (the values program of a call) for rows
        reserved by `reserve`: read and filled at the next drain. Returns its `Result`."""
        res = Result(out, rows)
        self._adopt(res)
        return res

    def adopt_result(self, res):
        """`adopt` for a `Result` made before its rows were reserved (`Ref`s to it were
        handed out while they were)."""
        self._adopt(res)

    def _adopt(self, res):
        for out in (res.out if isinstance(res.out, list) else (res.out,)):
            try:
                out.copy_to_host_async()
            except Exception:
                pass
        self.pending.append(res)
        self.values += len(res.rows)
        self.batches += 1

    def ids_of(self, x, logical=None):
        """(row string ids, nbytes) of a value's reserved row (x: an array, an aval or a
        `Ref`), made once per dtype and shape."""
        key = (x.dtype, x.shape, logical)
        hit = self._ids.get(key)
        if hit is None:
            storage, dname = storage_of(x.dtype)
            hit = self._ids[key] = (
                self.writer.value_ids(logical or dname, storage, tuple(x.shape)),
                math.prod(x.shape) * np.dtype(x.dtype).itemsize)
        return hit

    def reserve(self, eid, slot, x, role, name=None, logical=None):
        """Reserve a value's row (x: an array, an aval or a `Ref`); (handle, nbytes) for
        `adopt`. The row's string ids and byte count are made once per dtype and shape."""
        ids, nbytes = self.ids_of(x, logical)
        w = self.writer
        return w.reserve_ids(eid, slot, role, ids, w.intern(name)), nbytes

    def dispatch(self):
        """Values are hashed as they are added (kept for callers that mark a call's end)."""

    def _no_key_stats(self, rows, st, counts):
        """PRNG key data's rows get no statistics (values.STAT_FIELDS: counts only), as
        the host path writes them: its words are bits, not numbers."""
        for i, (handle, _) in enumerate(rows):
            if handle in self._keys:
                self._keys.discard(handle)
                st[i], counts[i] = np.nan, 0

    def _fill(self, handle, nbytes, host, i):
        a, b, floats, counts = host
        h = values.words_finish(a[i], b[i], nbytes)
        self.writer.fill_digest(handle, nbytes, h, None if floats is None else
                                (*floats[i].tolist(), *counts[i].tolist()))

    def drain(self):
        """Read every dispatched result and fill the writer's reserved rows."""
        w = self.writer
        if self._batch:   # a flush inside a batch: the rows reserved so far are filled now,
            # by the programs of one value (already compiled, unlike a partial batch's);
            # the values added later go on in a new Result
            res = self._batch_result
            res.out = self._one_by_one(self._batch)
            self._adopt(res)
            self._batch, self._batch_result = [], Result()
        if self.groups is not None:   # eager values whose program was still compiling
            with self.quiet():
                self.groups.settle()
        pending, self.pending = self.pending, []
        width = WORDS if self.with_stats else 2
        for res in pending:
            with self.quiet():
                out = res.out
                host = rows_of(out, width, res.take) if isinstance(out, list) else \
                    np.asarray(out)
            a, b, st, counts = unpack_all(host, self.with_stats)
            res.out = None
            res.host = (a, b, st, counts)
            rows = res.rows
            n = len(rows)
            hashes = finish_all(a[:n], b[:n], [nb for _, nb in rows]).tolist()
            if self._keys and st is not None:
                self._no_key_stats(rows, st, counts)
            if st is None:
                w.fill_digests(rows, hashes)
            else:
                w.fill_digests(rows, hashes, st[:n].tolist(), counts[:n].tolist())
            if res.extra:   # rows of other events taking this result's words (`add_ref`)
                idx = np.fromiter((i for _, _, i in res.extra), np.int64, len(res.extra))
                more = [(handle, nbytes) for handle, nbytes, _ in res.extra]
                hashes = finish_all(a[idx], b[idx], [nb for _, nb in more]).tolist()
                if st is None:
                    w.fill_digests(more, hashes)
                else:
                    w.fill_digests(more, hashes, st[idx].tolist(), counts[idx].tolist())
            res.rows, res.extra = (), ()
        if self.checks:
            self.settle_checks(drained=True)
