"""Many values digested by few programs, compiled once per dtype, shape and group size.

Measured on a TPU v5e (docs/accelerators.md, tenth session): a value's digest compiled
inside a values program costs ~0.4 s of that program's compile, value by value (a
4096-wide MLP step's 195 values: 31 s; its initialiser's: 33 s; 20 values of 16 MB: 7.9 s
against 0.5 s for the program returning them), while one digest program over a stack of
same-shaped values compiles about as fast as over one value. So a values program that
can afford it returns its values (probe.py), and they are digested here: values of one
dtype and shape stacked `k` at a time under one vmapped digest (`_group_fn`), by
programs compiled once per (dtype, shape, k, device) for the whole recording, kept
between runs by program_cache.py, and compiled ahead of their first use in background
threads (`prepare`) while XLA compiles the values program itself. The hashes are of the
very bytes the values program returned (no recomputation inside a hashing fusion).
"""

import concurrent.futures
import math
import os

import numpy as np

from . import digest_programs
from .digest_results import WORDS

MAX_GROUP = 16              # values a group program takes at most
GROUP_BYTES = 256 << 20     # ... and bytes: its stack is a copy of them
UNSTACKED_BYTES = 8 << 20   # values this large are digested where they lie (no stack, no copy),
MAX_UNSTACKED = 8           # up to this many a program, each its own reduction
RETURN_SHARE = 0.5          # a values program returns its values where they fit in this share
RETURN_CPU = 2 << 30        # of the device's free memory (where it reports none: bytes)
INSIDE_AFTER_CALLS = 1000   # later calls of a values program digest inside (`Prober.record`):
# the groups' copies and dispatches cost each call (a 4096-wide MLP's step on a TPU v5e: loop
# 1.13 s against 0.59 s for 20 steps) what that program's compile costs once (~31 s)
WAIT_BYTES = 1 << 30        # eager values held while their digest program compiles (`one`)


def _copy_async(outs):
    for out in outs:
        try:
            out.copy_to_host_async()
        except Exception:
            pass


def _own_copy(x, device):
    """A copy of x on its device that only tracediff holds, or None where JAX cannot make
    one without a program."""
    import jax

    try:
        return jax.device_put(x, device, may_alias=False)
    except Exception:
        return None


def enabled():
    """TRACEDIFF_JAX_DIGEST_GROUPS=0 digests every value inside its values program, as
    before (for comparisons)."""
    return os.environ.get("TRACEDIFF_JAX_DIGEST_GROUPS", "1") != "0"


def affordable(nbytes, device=None):
    """May a values program return values of `nbytes` bytes, all live at once, to be
    digested after it? A share of the device's free memory, where it reports it."""
    try:
        import jax

        stats = (device or jax.local_devices()[0]).memory_stats()
    except Exception:
        stats = None
    if not stats or "bytes_limit" not in stats:
        return nbytes <= RETURN_CPU
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return nbytes <= RETURN_SHARE * free


def _stacked(nbytes):
    """Are values of this size stacked under one vmapped digest (a copy of them, one
    reduction to compile), or digested where they lie (no copy, one reduction each)?"""
    return nbytes < UNSTACKED_BYTES


def _largest_group(nbytes):
    """The largest power of two k <= MAX_GROUP with k values within GROUP_BYTES (stacked),
    or k <= MAX_UNSTACKED (digested where they lie)."""
    if not _stacked(nbytes):
        return MAX_UNSTACKED
    k = max(1, min(MAX_GROUP, GROUP_BYTES // max(nbytes, 1)))
    return 1 << (k.bit_length() - 1)


def plan(avals):
    """(chunks, take) for values of these (shape, dtype, weak_type): chunks = [(key, value
    indices)], each key (shape, dtype, weak_type, k) with exactly k indices (a last, short
    chunk is padded to a power of two with its last value); take[i] = the row of value i
    among the chunks' rows end to end."""
    by_key = {}
    for i, a in enumerate(avals):
        by_key.setdefault(a, []).append(i)
    chunks, take, row = [], [0] * len(avals), 0
    for a, idx in by_key.items():
        shape, dtype = a[0], a[1]
        k_max = _largest_group(math.prod(shape) * np.dtype(dtype).itemsize)
        for start in range(0, len(idx), k_max):
            part = idx[start:start + k_max]
            k = 1 << (len(part) - 1).bit_length()
            for j, i in enumerate(part):
                take[i] = row + j
            chunks.append(((*a, k), part + [part[-1]] * (k - len(part))))
            row += k
    return chunks, np.asarray(take, np.int64)


def group_key(x):
    """(shape, dtype, weak_type) of an array, a tracer or an aval (a numpy constant: not
    weak), what picks its group program."""
    return tuple(x.shape), np.dtype(x.dtype), bool(getattr(x, "weak_type", False))


def _spec(key, device):
    """The abstract argument of a group key's (shape, dtype, weak_type) on `device`."""
    import jax
    from jax.sharding import SingleDeviceSharding

    return jax.ShapeDtypeStruct(key[0], key[1], sharding=SingleDeviceSharding(device),
                                weak_type=key[2])


def _group_fn(with_stats, together, k, empty, stacked=True):
    """Traced: the rows (k, WORDS or 2) of k values of one dtype and shape."""
    import jax
    import jax.numpy as jnp

    width = WORDS if with_stats else 2
    if empty:
        row = digest_programs.EMPTY_WORDS[:width]
        return lambda *xs: jnp.tile(jnp.array(row, jnp.uint32), (k, 1))
    one = (lambda x: digest_programs._digest(x, True, together)[0]) if with_stats else \
        digest_programs.lanes
    if k == 1:
        return lambda x: one(x)[None]
    if not stacked:
        return lambda *xs: jnp.stack([one(x) for x in xs])
    return lambda *xs: jax.vmap(one)(jnp.stack(xs))


class DigestGroups:
    """Runs `plan`'s group programs for a recording; their executables per (key, device,
    with_stats), compiled in background threads where `prepare` saw them coming."""

    def __init__(self, programs, quiet):
        self.programs = programs     # program_cache.ProgramCache
        self.quiet = quiet           # context manager: tracediff's own JAX work
        self._exes = {}              # (key, device id, with_stats) -> executable or Future
        self._join = None            # `join` where its prepared program failed
        self.groups = self.prepared = 0
        self.returning = self.inside = 0   # values programs that return their values, or not
        self._waiting, self._waiting_bytes = [], 0   # values (`later`), compile under way
        self.waited = 0
        self.host_hashed = 0   # level full: values hashed on the host while their program compiled

    def _compile(self, key, device, with_stats):
        import jax

        shape, dtype, weak, k = key
        n = math.prod(shape)
        fn = _group_fn(with_stats, digest_programs.one_pass(), k, n == 0,
                       _stacked(n * np.dtype(dtype).itemsize))
        with self.quiet():
            return self.programs.compile(jax.jit(fn).lower(*[_spec(key, device)] * k),
                                         [device.id])

    def prepare_join(self, xs, device):
        """Level full: start compiling, in a background thread, the program that joins the
        words of values like xs (arrays or tracers) on `device` end to end (one copy to the
        host for a values program's small values); its Future, for `join`. A program of
        its own, compiled beside the values program: joined inside it, a Flax block's
        ~300 small values took 21 of its 22 s to compile on a TPU v5e."""
        import jax

        specs = [_spec(group_key(x), device) for x in xs]

        def compile_join():
            with self.quiet():
                return self.programs.compile(
                    jax.jit(lambda *a: digest_programs.join(list(a), stack=True)).lower(*specs),
                    [device.id])

        return self.programs.submit(compile_join)

    def join(self, prepared, xs):
        """The joined words of arrays xs, by `prepare_join`'s program (by `jax.jit` where
        that failed or does not take them)."""
        with self.quiet():
            try:
                return prepared.result()(*xs)
            except Exception as exc:
                self.programs._error(f"join: {type(exc).__name__}: {str(exc)[:200]}")
                if self._join is None:
                    self._join = self.programs.jit(
                        lambda *a: digest_programs.join(list(a), stack=True))
                return self._join(*xs)

    def accepts(self, kept, device, with_stats=True):
        """While a values program is traced: will its digested values (kept: tracers) be
        returned, to be digested here after it? Where the call's arguments are on one
        device (not None) and the values fit in its memory (`affordable`); their group
        programs then start compiling, while XLA compiles the values program."""
        if device is None:
            return False
        avals = [group_key(x) for x in kept]
        unique = {id(x): a for x, a in zip(kept, avals)}.values()   # a value twice: once
        if not affordable(sum(math.prod(a[0]) * a[1].itemsize for a in unique), device):
            self.inside += 1
            return False
        self.returning += 1
        self.prepare(avals, device, with_stats)
        return True

    def prepare(self, avals, device, with_stats=True):
        """Start compiling, in background threads, the group programs that values of
        these (shape, dtype, weak_type) on `device` will need."""
        chunks, _ = plan(avals)
        todo = [(key, device.id, with_stats) for key, _ in chunks]
        todo = [t for t in dict.fromkeys(todo) if t not in self._exes]
        for t in todo:
            self._exes[t] = self.programs.submit(self._compile, t[0], device, with_stats)
            self.prepared += 1

    def ready(self, xs, device, with_stats=True):
        """Are the group programs of arrays xs on `device` compiled? Those that are not
        start compiling in the background (`prepare`)."""
        keys = [group_key(x) for x in xs]
        chunks, _ = plan(keys)
        exes = [self._exes.get((key, device.id, with_stats)) for key, _ in chunks]
        if any(e is None for e in exes):
            self.prepare(keys, device, with_stats)
            return False
        return all(not isinstance(e, concurrent.futures.Future) or e.done() for e in exes)

    def _exe(self, key, device, with_stats):
        t = (key, device.id, with_stats)
        exe = self._exes.get(t)
        if isinstance(exe, concurrent.futures.Future):
            try:
                exe = exe.result()
            except Exception as exc:   # compile it here, through jax.jit, below
                self.programs._error(f"group: {type(exc).__name__}: {str(exc)[:200]}")
                exe = None
            self._exes[t] = exe
        if exe is None:
            exe = self._exes[t] = self._compile(key, device, with_stats)
        return exe

    def run(self, xs, device, with_stats=True):
        """(the group programs' outputs, take) for arrays xs, all on `device`: their rows
        are `np.concatenate(outputs)[take]` (digest_results.Result)."""
        chunks, take = plan([group_key(x) for x in xs])
        outs = []
        with self.quiet():
            for key, idx in chunks:
                outs.append(self._exe(key, device, with_stats)(*[xs[i] for i in idx]))
        self.groups += len(chunks)
        return outs, take

    def one(self, x, device, with_stats, res):
        """An eager value's digest into `res` (a `digest_results.Result`): run now where its
        program is compiled, else left waiting (`later`)."""
        if not self.later([x], device, with_stats, res):   # the caller adopts res (its
            res.out, res.take = self.run([x], device, with_stats)   # copy starts there)

    def later(self, xs, device, with_stats, res):
        """Leave values xs waiting, their digests to run into `res` (`settle`), where a
        program they need is still compiling in the background: so that the first values
        of several new shapes (a model's initialisation, a call's first outputs) compile
        side by side instead of one after another (on a TPU v5e 1.2-2.8 s each) while the
        script goes on. Returns whether they wait: at most WAIT_BYTES wait at once, within
        a share of the device's free memory (their copies take it); past that they run
        now, their compiles awaited. Those waiting whose programs are ready by now run."""
        own = None
        if not self.ready(xs, device, with_stats):
            need = sum(x.nbytes for x in xs)
            if self._waiting_bytes + need > WAIT_BYTES:
                self.settle()   # the copies held so far freed, their compiles awaited
            if need <= WAIT_BYTES and affordable(need, device):
                own = [_own_copy(x, device) for x in xs]   # the script may donate or
                if any(o is None for o in own):            # delete xs meanwhile
                    own = None
        if own is not None:
            self._waiting.append((own, device, with_stats, res))
            self._waiting_bytes += sum(o.nbytes for o in own)
            self.waited += len(own)
        if self._waiting:
            self.settle(only_ready=True)
        return own is not None

    def settle(self, only_ready=False):
        """Run the waiting values' digests (their compiles awaited, unless only_ready)."""
        keep = []
        for xs, device, with_stats, res in self._waiting:
            if only_ready and not self.ready(xs, device, with_stats):
                keep.append((xs, device, with_stats, res))
                continue
            res.out, res.take = self.run(xs, device, with_stats)
            _copy_async(res.out)
        self._waiting = keep
        self._waiting_bytes = sum(o.nbytes for w in keep for o in w[0])

    def manifest(self):
        return {"groups_run": self.groups, "programs_prepared": self.prepared,
                "values_programs_returning_values": self.returning,
                "values_programs_digesting_inside": self.inside,
                "values_waited_for_their_program": self.waited,
                "values_hashed_on_host_while_their_program_compiled": self.host_hashed,
                "note": "values programs that return their values have them digested by group "
                        "programs compiled once per dtype, shape and group size; the others "
                        "(values beyond a share of the device's free memory) digest them "
                        "inside"}
