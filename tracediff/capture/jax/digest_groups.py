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
from .program_cache import settings_key
from .digest_results import WORDS, join_pieces, joined_starts, word_bytes

MAX_GROUP = 16              # values a group program takes at most
GROUP_BYTES = 256 << 20     # ... and bytes: its stack is a copy of them
UNSTACKED_BYTES = 8 << 20   # values this large are digested where they lie (no stack, no copy),
MAX_UNSTACKED = 8           # up to this many a program, each its own reduction
RETURN_SHARE = 0.5          # a values program returns its values where they fit in this share
RETURN_CPU = 2 << 30        # of the device's free memory (where it reports none: bytes)
INSIDE_AFTER_CALLS = 1000   # later calls of a values program digest inside (`Prober.record`):
# the groups' copies and dispatches cost each call (a 4096-wide MLP's step on a TPU v5e: loop
# 1.13 s against 0.59 s for 20 steps) what that program's compile costs once (~31 s)
WAIT_BYTES = 1 << 30        # values held while their digest program compiles (`digest`)
JOIN_PIECES = 6             # a values program's small values joined by up to this many
                            # programs, compiled side by side (`prepare_join`)


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


def _join_words(*xs):
    """Traced: the words of small values joined (a values program's, returned; a call's
    outputs; eager values), stacked a shape at a time: they are this program's arguments."""
    return digest_programs.join(list(xs), stack=True)


def host_join(xs):
    """`_join_words`' buffer made on the host: each value's bytes at its `joined_starts`
    offset, zero-padded to a word, in `join_groups`' order (what `HostView` reads). For a
    join whose program is still compiling: ~300 small values each copied to the host
    cost a Flax block's first step tens of ms, where waiting for the join's program
    cost it 3.8 s on a TPU v5e."""
    for x in xs:
        try:
            x.copy_to_host_async()
        except Exception:
            pass
    avals = [(x.shape, x.dtype) for x in xs]
    starts = joined_starts(avals, [True] * len(xs))
    buf = np.zeros(sum(word_bytes(*a) for a in avals), np.uint8)
    for x, at in zip(xs, starts):
        b = np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)
        buf[at:at + b.size] = b
    return buf.view(np.uint32)


class DigestGroups:
    """Runs `plan`'s group programs for a recording; their executables per (key, device,
    with_stats), compiled in background threads where `prepare` saw them coming."""

    def __init__(self, programs, quiet):
        self.programs = programs     # program_cache.ProgramCache
        self.quiet = quiet           # context manager: tracediff's own JAX work
        self._exes = {}              # (key, device id, with_stats) -> executable or Future
        self._join = None            # `join_now`'s program (made at its first use)
        self.groups = self.prepared = 0
        self.returning = self.inside = 0   # values programs that return their values, or not
        self._waiting, self._waiting_bytes = [], 0   # values (`_wait`), compile under way
        self.waited = 0
        self.host_hashed = 0   # level full: values hashed on the host while their program compiled
        self.host_joined = 0   # level full: values joined on the host while the join compiled

    def _compile(self, key, device, with_stats, settings):
        """The group program for `key` on `device`; `settings`: `settings_key()` on the
        thread that asked for it (this may run in a background thread)."""
        import jax

        shape, dtype, weak, k = key
        n = math.prod(shape)
        fn = _group_fn(with_stats, digest_programs.one_pass(), k, n == 0,
                       _stacked(n * np.dtype(dtype).itemsize))
        with self.quiet():
            return self.programs.compile(jax.jit(fn).lower(*[_spec(key, device)] * k),
                                         [device.id], settings)

    def prepare_join(self, xs, device):
        """Level full: start compiling, in background threads, the programs that join the
        words of values like xs (arrays or tracers) on `device` end to end (few copies to
        the host for a values program's small values), a run of their shape groups each
        (`join_pieces`); for `join`, [(the values' indices, Future)]. Programs of their
        own, compiled beside the values program: joined inside it, a Flax block's ~300
        small values took 21 of its 22 s to compile on a TPU v5e; in one program of their
        own, 5-7 s."""
        import jax

        specs = [_spec(group_key(x), device) for x in xs]
        settings = settings_key()   # here, on the script's thread

        def compile_join(piece):
            with self.quiet():
                return self.programs.compile(
                    jax.jit(_join_words).lower(*[specs[i] for i in piece]), [device.id],
                    settings)

        pieces = join_pieces([(x.shape, x.dtype) for x in xs], JOIN_PIECES)
        return [(piece, self.programs.submit(compile_join, piece)) for piece in pieces]

    def join(self, prepared, xs):
        """The joined words of arrays xs, by `prepare_join`'s programs (a list of their
        buffers, end to end), by `join_now` where one failed; on the host while any is
        still compiling."""
        if not all(f.done() for _, f in prepared):
            return self._host_join(xs)
        with self.quiet():
            try:
                return [f.result()(*[xs[i] for i in piece]) for piece, f in prepared]
            except Exception as exc:
                self.programs._error(f"join: {type(exc).__name__}: {str(exc)[:200]}")
        return self.join_now(xs)

    def join_now(self, xs):
        """The joined words of arrays xs (a call's outputs, eager values), by one program
        per signature, compiled in the background from its first use and joined on the
        host until it is ready."""
        if self._join is None:
            self._join = self.programs.jit(_join_words)
        with self.quiet():
            if not self._join.ready(*xs):
                return self._host_join(xs)
            return self._join(*xs)

    def _host_join(self, xs):
        with self.quiet():
            flat = host_join(xs)
        self.host_joined += len(xs)
        return flat

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
        self._start(plan(avals)[0], device, with_stats)

    def _start(self, chunks, device, with_stats):
        todo = [(key, device.id, with_stats) for key, _ in chunks]
        todo = [t for t in dict.fromkeys(todo) if t not in self._exes]
        for t in todo:
            self._exes[t] = self.programs.submit(self._compile, t[0], device, with_stats,
                                                 settings_key())
            self.prepared += 1

    def ready(self, xs, device, with_stats=True):
        """Are the group programs of arrays xs on `device` compiled? Those that are not
        start compiling in the background (`prepare`)."""
        return self._ready(plan([group_key(x) for x in xs])[0], device, with_stats)

    def _ready(self, chunks, device, with_stats):
        exes = [self._exes.get((key, device.id, with_stats)) for key, _ in chunks]
        if any(e is None for e in exes):
            self._start(chunks, device, with_stats)
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
            exe = self._exes[t] = self._compile(key, device, with_stats, settings_key())
        return exe

    def run(self, xs, device, with_stats=True, planned=None):
        """(the group programs' outputs, take) for arrays xs, all on `device`: their rows
        are `np.concatenate(outputs)[take]` (digest_results.Result). `planned`: their
        `plan`, where the caller made it."""
        chunks, take = planned or plan([group_key(x) for x in xs])
        outs = []
        with self.quiet():
            for key, idx in chunks:
                outs.append(self._exe(key, device, with_stats)(*[xs[i] for i in idx]))
        self.groups += len(chunks)
        return outs, take

    def digest(self, xs, device, with_stats, res):
        """Values xs digested into `res` (a `digest_results.Result`; the caller adopts it,
        its copy starts there): now where their programs are compiled, else left waiting
        (`_wait`, run by `settle`), so that the first values of several new shapes (a
        model's initialisation, a call's first outputs) compile side by side instead of
        one after another (on a TPU v5e 1.2-2.8 s each) while the script goes on. Those
        waiting whose programs are ready by now run."""
        planned = plan([group_key(x) for x in xs])   # once: a call's outputs, every call
        if self._ready(planned[0], device, with_stats) or \
                not self._wait(xs, device, with_stats, res):
            res.out, res.take = self.run(xs, device, with_stats, planned)
        if self._waiting:
            self.settle(only_ready=True)

    def _wait(self, xs, device, with_stats, res):
        """Keep copies of xs waiting for their programs (the script may donate or delete
        xs meanwhile): at most WAIT_BYTES at once, within a share of the device's free
        memory (a step's outputs can be a model's whole state). Returns whether they wait;
        past the bound they run now, their compiles awaited."""
        need = sum(x.nbytes for x in xs)
        if self._waiting_bytes + need > WAIT_BYTES:
            self.settle()   # the copies held so far freed, their compiles awaited
        if need > WAIT_BYTES or not affordable(need, device):
            return False
        own = [_own_copy(x, device) for x in xs]
        if any(o is None for o in own):
            return False
        self._waiting.append((own, device, with_stats, res))
        self._waiting_bytes += need
        self.waited += len(own)
        return True

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
                "values_joined_on_host_while_their_program_compiled": self.host_joined,
                "note": "values programs that return their values have them digested by group "
                        "programs compiled once per dtype, shape and group size; the others "
                        "(values beyond a share of the device's free memory) digest them "
                        "inside"}
