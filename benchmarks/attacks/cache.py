"""tracediff's program cache (capture/jax/program_cache.py, cache_entries.py), attacked in
this process with a real JAX program: an entry filled under one setting asked for under
another, hostile files in the folder, folders others may write to, a full disk."""

import contextlib
import os
import pickle
import shutil
import stat
import subprocess
import sys
import threading

import numpy as np

SETTINGS = [("jax_disable_most_optimizations", True), ("jax_default_matmul_precision", "highest"),
            ("jax_exec_time_optimization_effort", 0.5), ("jax_memory_fitting_effort", 0.5),
            ("jax_numpy_dtype_promotion", "strict"), ("jax_enable_checks", True)]
ENV = [("XLA_FLAGS", "--xla_cpu_max_isa=SSE4_2"), ("LIBTPU_INIT_ARGS", "--xla_tpu_x=1"),
       ("TPU_ACCELERATOR_TYPE", "v5e"), ("JAX_SOMETHING_NEW", "1")]


def _program():
    import jax
    import jax.numpy as jnp

    def f(x):
        return jnp.tanh(x) @ x.T + jnp.log1p(x * x).sum()

    x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)
    return jax.jit(f), x


def _compile(folder):
    """(the cache after one program compiled or loaded through it, the result)."""
    from tracediff.capture.jax.program_cache import ProgramCache

    cache = ProgramCache(folder)
    fn, x = _program()
    prog = cache.jit(fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn)
    out = np.asarray(prog(x))
    return cache, out


def _entries(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".xla"))


@contextlib.contextmanager
def _setting(name, value):
    import jax

    before = jax.config.values[name]
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, before)


@contextlib.contextmanager
def _env(name, value):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _fill(work):
    folder = os.path.join(work, "xla")
    cache, out = _compile(folder)
    assert cache.stored == 1 and cache.compiled == 1, cache.manifest()
    return folder, out


def _setting_attack(name, value, env=False):
    def attack(work):
        folder, _ = _fill(work)
        with (_env if env else _setting)(name, value):
            cache, _ = _compile(folder)
        held = cache.compiled == 1 and cache.loaded == 0
        return held, f"under {name}={value!r}: loaded {cache.loaded}, compiled {cache.compiled}"
    return attack


def _same_again(work):
    folder, out = _fill(work)
    cache, again = _compile(folder)
    return (cache.loaded == 1 and np.array_equal(out, again),
            f"the same settings: loaded {cache.loaded}, same result {np.array_equal(out, again)}")


def _hostile(make, expect):
    """An attack that replaces every entry by what `make(path, work)` leaves there; held
    when the next compile neither loads it nor fails, and an error containing `expect`
    is noted (where `expect` is given)."""
    def attack(work):
        folder, out = _fill(work)
        for path in _entries(folder):
            make(path, work)
        result = {}

        def run():
            result["cache"], result["out"] = _compile(folder)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(60)
        if t.is_alive():
            return False, "the compile hung (over 60 s)"
        cache = result["cache"]
        errors = "; ".join(cache.errors)
        held = cache.loaded == 0 and cache.compiled == 1 and \
            np.array_equal(result["out"], out) and (expect is None or expect in errors)
        return held, f"loaded {cache.loaded}, compiled {cache.compiled}; {errors[:140] or 'no error'}"
    return attack


def _garbage(path, work):
    with open(path, "wb") as f:
        f.write(b"not an executable")


def _truncated(path, work):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def _appended(path, work):
    with open(path, "ab") as f:
        f.write(b"\0" * 16)


def _flip(offset):
    def make(path, work):
        data = bytearray(open(path, "rb").read())
        data[offset if offset >= 0 else len(data) + offset] ^= 1
        with open(path, "wb") as f:
            f.write(bytes(data))
    return make


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _planted(path, work):
    with open(path, "wb") as f:
        f.write(pickle.dumps(_Planted(os.path.join(work, "pwned"))))


def _planted_after_seal(path, work):
    """A pickle behind a copy of a real entry's header (magic and seal)."""
    from tracediff.capture.jax import cache_entries as ce

    head = open(path, "rb").read()[:len(ce.MAGIC) + ce.SEAL_BYTES]
    with open(path, "wb") as f:
        f.write(head + pickle.dumps(_Planted(os.path.join(work, "pwned"))))


def _fifo(path, work):
    os.remove(path)
    os.mkfifo(path)


def _dev_zero(path, work):
    os.remove(path)
    os.symlink("/dev/zero", path)


def _link_to_copy(path, work):
    """The file made a link to a copy of itself, outside the folder."""
    copy = os.path.join(work, "copy-" + os.path.basename(path))
    shutil.copy(path, copy)
    os.remove(path)
    os.symlink(copy, path)


def _directory(path, work):
    os.remove(path)
    os.mkdir(path)


def _empty(path, work):
    open(path, "wb").close()


def _huge(path, work):
    from tracediff.capture.jax import cache_entries as ce

    with open(path, "r+b") as f:
        f.truncate(ce.MAX_ENTRY_BYTES + 1)   # sparse: costs no disk


def _swapped(work):
    """Two programs' entries swapped: each sealed for the other's name."""
    import jax
    import jax.numpy as jnp

    from tracediff.capture.jax.program_cache import ProgramCache

    folder = os.path.join(work, "xla")
    fns = [jax.jit(lambda x: jnp.tanh(x) * 2), jax.jit(lambda x: jnp.sin(x) * 3)]
    x = jnp.ones((4,), jnp.float32)
    cache = ProgramCache(folder)
    outs = [np.asarray(cache.jit(f)(x)) for f in fns]
    a, b = _entries(folder)
    da, db = open(a, "rb").read(), open(b, "rb").read()
    open(a, "wb").write(db)
    open(b, "wb").write(da)
    cache = ProgramCache(folder)
    again = [np.asarray(cache.jit(f)(x)) for f in fns]
    held = cache.loaded == 0 and all(np.array_equal(p, q) for p, q in zip(outs, again))
    return held, f"loaded {cache.loaded}, compiled {cache.compiled}; {'; '.join(cache.errors)[:120]}"


def _key_attack(make, expect_used):
    def attack(work):
        folder, out = _fill(work)
        make(os.path.join(folder, ".key"), work)
        cache, again = _compile(folder)
        used = cache.path is not None
        held = used == expect_used and cache.loaded == 0 and np.array_equal(out, again)
        return held, (f"folder used {used}, loaded {cache.loaded}, compiled {cache.compiled}; "
                      f"{'; '.join(cache.errors)[:120] or 'no error'}")
    return attack


def _key_removed(path, work):
    os.remove(path)


def _key_short(path, work):
    with open(path, "wb") as f:
        f.write(b"short")


def _key_readable(path, work):
    os.chmod(path, 0o644)


def _folder_attack(prepare):
    def attack(work):
        folder = prepare(work)
        cache, _ = _compile(folder)
        held = cache.path is None and cache.stored == 0 and not _entries_in(folder)
        return held, f"folder used {cache.path is not None}; {'; '.join(cache.errors)[:140]}"
    return attack


def _entries_in(folder):
    return os.path.isdir(folder) and [n for n in os.listdir(folder) if n.endswith(".xla")]


def _group_writable(work):
    folder = os.path.join(work, "xla")
    os.makedirs(folder)
    os.chmod(folder, 0o770)
    return folder


def _other_writable(work):
    folder = os.path.join(work, "xla")
    os.makedirs(folder)
    os.chmod(folder, 0o707)
    return folder


def _open_above(work):
    above = os.path.join(work, "open")
    os.makedirs(above)
    os.chmod(above, 0o777)
    return os.path.join(above, "xla")


def _another_users(work):
    folder = os.path.join(work, "xla")
    os.makedirs(folder, mode=0o700)
    os.chown(folder, 65534, 65534)
    return folder


def _sticky_above(work):
    above = os.path.join(work, "sticky")
    os.makedirs(above)
    os.chmod(above, 0o777 | stat.S_ISVTX)
    folder = os.path.join(above, "xla")
    cache, _ = _compile(folder)
    return cache.path is not None and cache.stored == 1, \
        f"a sticky world-writable folder above (as /tmp): used {cache.path is not None}"


def _full_disk(work):
    folder = os.path.join(work, "xla")
    os.makedirs(folder, mode=0o700)
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "from tracediff.capture.jax.cache_entries import write_entry\n"
            "try:\n    write_entry(sys.argv[1], b'x' * 100000)\nexcept OSError as e:\n"
            "    print('failed', e.errno)\n")
    proc = subprocess.run([sys.executable, "-c", code, os.path.join(folder, "e.xla")],
                          capture_output=True, text=True, timeout=60)
    left = os.listdir(folder)
    return proc.stdout.startswith("failed") and not left, f"write failed: {proc.stdout.strip()}; left {left}"


def _stale_tmp(work):
    from tracediff.capture.jax import cache_entries as ce

    folder = os.path.join(work, "xla")
    os.makedirs(folder, mode=0o700)
    for name, age in (("old.xla.1.aa.tmp", 7200), ("new.xla.2.bb.tmp", 10), ("e.xla", 10)):
        p = os.path.join(folder, name)
        open(p, "wb").write(b"x" * 100)
        t = time_now() - age
        os.utime(p, (t, t))
    total = ce.trim(folder, 10 ** 9)
    left = sorted(os.listdir(folder))
    return left == ["e.xla", "new.xla.2.bb.tmp"] and total == 200, f"left {left}, counted {total} B"


def _trim_order(work):
    from tracediff.capture.jax import cache_entries as ce

    folder = os.path.join(work, "xla")
    os.makedirs(folder, mode=0o700)
    for i, name in enumerate(("a.xla", "b.xla", "c.xla")):
        p = os.path.join(folder, name)
        open(p, "wb").write(b"x" * 100)
        os.utime(p, (time_now() - 100 + i, time_now() - 100 + i))
    ce.trim(folder, 150)
    left = sorted(os.listdir(folder))
    return left == ["c.xla"], f"over the bound, left {left} (the newest kept)"


def time_now():
    import time

    return time.time()


def _jax_own_cache(work):
    import jax

    jax_dir = os.path.join(work, "jax")
    before = jax.config.values["jax_compilation_cache_dir"]
    jax.config.update("jax_compilation_cache_dir", jax_dir)
    try:
        cache, _ = _compile(os.path.join(work, "xla"))
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    return (cache.path is None and cache.jax_cache == jax_dir and cache.stored == 0,
            f"JAX's own cache on: tracediff's folder used {cache.path is not None}")


ATTACKS = [("the same settings load the entry (control)", _same_again)] + \
    [(f"config {k} changed after the fill", _setting_attack(k, v)) for k, v in SETTINGS] + \
    [(f"env {k} set after the fill", _setting_attack(k, v, env=True)) for k, v in ENV] + [
    ("garbage in place of an entry", _hostile(_garbage, "not an entry")),
    ("an entry cut in half", _hostile(_truncated, "seal does not check")),
    ("bytes appended to an entry", _hostile(_appended, "seal does not check")),
    ("one bit of the payload flipped", _hostile(_flip(-100), "seal does not check")),
    ("one bit of the seal flipped", _hostile(_flip(20), "seal does not check")),
    ("the magic changed", _hostile(_flip(0), "not an entry")),
    ("a planted pickle", _hostile(_planted, "not an entry")),
    ("a planted pickle behind a real entry's header", _hostile(_planted_after_seal,
                                                              "seal does not check")),
    ("a FIFO in place of an entry", _hostile(_fifo, "not a regular file")),
    ("a link to /dev/zero", _hostile(_dev_zero, None)),
    ("a link to a valid copy of the entry", _hostile(_link_to_copy, None)),
    ("a folder in place of an entry", _hostile(_directory, None)),
    ("an empty entry", _hostile(_empty, "not an entry")),
    ("an entry over the size bound (sparse)", _hostile(_huge, "over")),
    ("two programs' entries swapped", _swapped),
    ("the key removed (a new one: old entries fail)", _key_attack(_key_removed, True)),
    ("the key a link", _key_attack(_link_to_copy, False)),
    ("the key cut short", _key_attack(_key_short, False)),
    ("the key readable by others", _key_attack(_key_readable, False)),
    ("a group-writable folder", _folder_attack(_group_writable)),
    ("an others-writable folder", _folder_attack(_other_writable)),
    ("a world-writable folder above, no sticky bit", _folder_attack(_open_above)),
    ("a folder of another user's", _folder_attack(_another_users)),
    ("a sticky world-writable folder above (allowed)", _sticky_above),
    ("a full disk during a write", _full_disk),
    ("a temporary whose writer died", _stale_tmp),
    ("the trim's order", _trim_order),
    ("JAX's own persistent cache on", _jax_own_cache),
]
