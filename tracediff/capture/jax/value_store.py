"""How the JAX capture writes a value, and which event made each array.

A value is an array, a Python scalar or a `digest_results.Ref` to a value digested
already; where values are hashed on their device (device_digests.py, chosen per backend
with the trace's hash: `_choose_hash`) no bytes cross to the host at levels stats and
calls, and at level full a call's outputs come back by one program (`_fetch_at_full`).
Every array written is registered as its event's output (`producer`), so that the
events that take it as an input link to it; an array never seen gets an `input`
snapshot event.
"""

import contextlib
import weakref

import numpy as np

from ...trace import schema, values
from . import device_digests, devices, digest_results, internals


class _Values:
    """JaxCapture's values: written, hashed where they are, and their producers."""

    def _choose_hash(self, w):
        """The trace's hash (`record --hash`): words64 where values are hashed on their
        device (an accelerator, by default), which the host computes too (CPU traces
        compare with TPU traces hash to hash under --hash words64); else xxh3_64."""
        want = getattr(self.opts, "hash", "auto")
        device = digest_results.on_device()
        if want == "auto":
            want = values.WORDS_HASH_NAME if device else values.HASH_NAME
        if not w.use_hash(want):   # values already written (another framework): keep theirs
            return
        if want == values.WORDS_HASH_NAME and device:
            self.digests = device_digests.DeviceDigests(w, self._quiet, self.programs)

    def _prepare_outputs(self, closed, args):
        """Once per jitted program, before its first call runs: the digest programs its
        outputs will take start compiling in the background (`DeviceDigests.prepare`)
        while JAX compiles the program itself."""
        if self.digests is None:
            return
        seen = self._prepared_outputs
        if seen.get(id(closed)) is closed:
            return
        if len(seen) > 1024:   # shapes that change every step: jaxprs not kept forever
            seen.clear()
        seen[id(closed)] = closed
        self.digests.prepare(closed.out_avals, args)

    def _outputs(self):
        """A call's outputs: hashed on the device as one program (device_digests)."""
        if self.digests is None or self.session.writer.level == "full":
            return contextlib.nullcontext()
        return self.digests.outputs()

    def _fetch_at_full(self, xs, same_as=None):
        """Level full, values hashed on the device: [(what to store, hash, kept)] of a
        call's outputs (or an optimizer step's values) by one program and few copies
        (`DeviceDigests.fetch`): a `HostView` where the value came back joined, else the
        array; (x, None, None) for each value `store` hashes itself (and at other levels);
        a `digest_results.Fetched` gives its own (an optimizer step's value fetched with its
        values program's). `same_as`: the values program's final outputs (`Fetched`) of a
        call whose outputs these are: an output with the same hash, dtype and shape points
        at the bytes the trace holds for it already (`kept`: their blob offset), and its
        own bytes never cross to the host."""
        out = [(x.value, x.h, x.kept) if type(x) is digest_results.Fetched else (x, None, None)
               for x in xs]
        if self.digests is None or self.session.writer.level != "full":
            return out
        at = [i for i, x in enumerate(xs) if x is not None and type(x) is not
              digest_results.Fetched and digest_results.can_digest(x)]
        if at:
            twins = [None] * len(xs)
            if same_as is not None and len(same_as) == len(xs):
                twins = [f if type(f) is digest_results.Fetched and f.kept is not None else None
                         for f in same_as]
            try:
                got = self.digests.fetch([xs[i] for i in at],
                                         copy=any(twins[i] is None for i in at))
            except Exception:   # never break the script: `store` takes each value alone
                return out
            for i, (h, host) in zip(at, got):
                f, kept = twins[i], None
                if f is not None and f.h == h and f.value.dtype == xs[i].dtype and \
                        tuple(f.value.shape) == tuple(xs[i].shape):
                    kept = f.kept
                out[i] = (xs[i] if host is None else host, h, kept)
        return out

    def producer(self, x, label="input"):
        """(event, slot) that produced array x; unseen arrays get an `input` snapshot event."""
        entry = self._producers.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1], entry[2]
        if isinstance(x, (int, float, complex, bool, np.generic)):
            return schema.PRODUCER_LITERAL, 0
        w = self.session.writer
        eid = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_INPUT, op="input",
                          origin=schema.ORIGIN_SNAPSHOT, params=label, name_stack=self._name_stack(),
                          source=self._live_source(), step=self.step)
        self.store(eid, 0, x)
        self._register(x, eid, 0)
        return eid, 0

    def _register(self, x, eid, slot):
        try:
            self._producers[id(x)] = (weakref.ref(x), eid, slot)
        except TypeError:
            pass
        if len(self._producers) > 200_000:  # drop dead entries now and then
            self._producers = {k: v for k, v in self._producers.items() if v[0]() is not None}

    def registered(self, x):
        """(event, slot) of an array already registered as produced, else None."""
        entry = self._producers.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1], entry[2]
        return None

    def optim_value(self, x, replayed=False):
        """An optax-tagged value kept for the step's event: on the host, or left on its
        device where values are hashed there (stored by `store` at `flush_optim`).
        `replayed`: a value of the call's replay, which nothing but the call itself can
        delete before the step is written, and only as an argument it donates: kept as it
        is (a host copy of a train step's tags was ~40 MB a step)."""
        if replayed and hasattr(x, "dtype") and id(x) not in self._call_donated:
            return x
        return x if self.digests is not None and digest_results.can_digest(x) else self._host(x)

    def store(self, eid, slot, x, name=None, role=schema.ROLE_OUT, store=True, stats=None,
              h=None, kept=None):
        """Write one value (an array, a Python scalar, or a `digest_results.Ref` to a value
        digested already); returns its `Ref` where it is hashed on the device, else None.
        `kept`: with `h`, where the blob holds x's bytes already (`digest_results.Fetched`)."""
        w = self.session.writer
        if type(x) is digest_results.Ref:   # an optimizer step's value, digested in its program
            self.digests.add_ref(eid, slot, x, role, name)
            return x
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            if isinstance(x, (int, float, complex, bool, np.generic)):
                w.add_value(eid, slot, np.asarray(x), role=role, name=name, store=store)
            return
        if not store:  # outside an --ops/--modules window: shape and dtype only
            text = self._dtype_names.get(dtype)
            if text is None:   # str(dtype) costs ~5 us; a call's arguments, every step
                text = self._dtype_names[dtype] = str(dtype)
            w.add_meta_value(eid, slot, text, getattr(x, "shape", ()), role=role, name=name)
            return
        logical = None
        if internals.is_key_dtype(dtype):
            import jax

            logical, x = str(dtype), jax.random.key_data(x)
        elif kept is not None and h is not None:   # bytes held already: a row, no array
            w.add_kept_value(eid, slot, dtype, tuple(x.shape), kept, h, role=role, name=name)
            return
        if h is None and self.digests is not None and digest_results.can_digest(x):
            if w.level != "full":   # hash and statistics on the device: no bytes cross
                return self.digests.add(eid, slot, x, role, name, logical)
            try:
                h, arr = self.digests.fetch([x], wait=False)[0]
            except Exception:   # a program the device could not run: hashed on the host
                h, arr = None, None
        else:
            arr = None
        again = h is None and logical is None and self._hashed.get(id(x))
        if again and again[0]() is x:   # this array hashed already in this call
            h = again[1]
        try:
            arr = np.asarray(x if arr is None else arr)
        except Exception:  # tokens, non-addressable arrays: keep shape and dtype only
            w.add_meta_value(eid, slot, str(dtype), getattr(x, "shape", ()), role=role, name=name)
            if self.per_device:   # a process's own shards of a multi-process array
                self.shards += devices.store_shards(w, eid, slot, x, None, role, logical)
            return
        h = w.add_value(eid, slot, arr, role=role, name=name, logical_dtype=logical, stats=stats,
                        h=h)
        if logical is None and not isinstance(x, np.ndarray):   # immutable: a JAX array
            self._remember_hash(x, h)
        if self.per_device:
            self.shards += devices.store_shards(w, eid, slot, x, arr, role, logical)

    def _remember_hash(self, x, h):
        """Keep the hash of a JAX array just written: an array written again while alive
        (an optax tag is its input array, written again in the step's snapshot; ~40 MB
        a step of the MLP hashed twice more) takes it instead of hashing its bytes again.
        JAX arrays never change; the memo is emptied at each call and kept small."""
        if len(self._hashed) >= 4096:
            self._hashed = {}
        try:
            self._hashed[id(x)] = (weakref.ref(x), h)
        except TypeError:   # not an array that takes weak references
            pass

    def _arg_needs_bytes(self, ref):
        """A call argument produced by a recorded event is that event's output, already
        hashed and stored: the call keeps only its name, dtype and shape (locate follows the
        dataflow edge), which halves the work per call at --level calls. Arguments with no
        recorded producer, and any argument under an --ops/--modules window (whose producer
        may not have kept its value), are stored."""
        return ref[0] < 0 or self.filtered

    @staticmethod
    def _host(x):
        try:
            return np.array(x, copy=True)
        except Exception:
            return None
