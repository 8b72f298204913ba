"""The files of tracediff's program cache (program_cache.py): where they may live, how an
entry is sealed so that only one this user wrote is ever loaded, and the trim.

A loaded entry is an XLA executable (machine code on XLA:CPU) inside a pickle of JAX's
(`jax.experimental.serialize_executable`): loading one runs what it holds. So an entry is
loaded only when
- the folder and every folder above it are this user's or root's and no one else may write
  to them (a world-writable folder above counts only with its sticky bit, as /tmp has),
- it is a regular file of this user's, not a link (opened with O_NOFOLLOW and O_NONBLOCK, so
  a FIFO or a device never blocks or streams), of at most `MAX_ENTRY_BYTES`,
- its seal checks: an HMAC-SHA256, keyed by a secret only this user can read (`.key` in the
  folder, made once with O_EXCL), over the entry's name and bytes; a planted file, a file
  of another machine's cache or a truncated one is compiled again, never unpickled,
- and its pickle names only JAX's, jaxlib's and numpy's classes (`_Unpickler.find_class`).
"""

import hashlib
import hmac
import io
import os
import secrets
import stat
import time

MAGIC = b"tracediff-xla-2\n"
SEAL_BYTES = 32
KEY_FILE = ".key"
MAX_ENTRY_BYTES = 1 << 30
STALE_TMP_SECONDS = 3600   # a temporary older than this was left by a writer that died
ALLOWED_MODULES = ("jax", "jaxlib", "numpy", "ml_dtypes")


class EntryError(Exception):
    """An entry that must not be loaded: compile instead, say why in the manifest."""


def unsafe_folder(path):
    """Why `path` (an existing folder) or a folder above it may hold files of someone
    else's, or None: each must be this user's or root's, and writable by no one else
    unless its sticky bit is set (then others cannot replace what is ours in it)."""
    me = os.getuid() if hasattr(os, "getuid") else None
    here = os.path.abspath(path)
    first = True
    while True:
        st = os.stat(here)
        owners = (me,) if first else (me, 0)
        if me is not None and st.st_uid not in owners:
            return f"{here} belongs to another user"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (first or not st.st_mode & stat.S_ISVTX):
            return f"{here} is writable by others"
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here, first = parent, False


def secret(folder):
    """This folder's key: 32 random bytes in `.key`, readable by this user alone; made once,
    whole (written aside, then linked in: two recordings racing agree on the first)."""
    path = os.path.join(folder, KEY_FILE)
    if not os.path.lexists(path):
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            write_entry(tmp, secrets.token_bytes(SEAL_BYTES), replace=False)
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            _remove(tmp)
    key = read_bounded(path, SEAL_BYTES, private=True)
    if len(key) != SEAL_BYTES:
        raise EntryError(f"{path}: not a key of {SEAL_BYTES} bytes (still being written?)")
    return key


def read_bounded(path, limit, private=False):
    """The bytes of `path` where it is this user's regular file of at most `limit` bytes
    (with `private`, readable by no one else); EntryError otherwise. Never follows a link,
    never blocks on a FIFO, never reads more than the file's size."""
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise EntryError(f"{name}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)   # before any read: a folder, a FIFO or a device is no entry
        if not stat.S_ISREG(st.st_mode):
            raise EntryError(f"{name}: not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise EntryError(f"{name}: belongs to another user")
        if private and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EntryError(f"{name}: others may read or write it")
        if st.st_size > limit:
            raise EntryError(f"{name}: {st.st_size} bytes, over {limit}")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise EntryError(f"{name}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _mac(key, name, payload):
    return hmac.new(key, name.encode() + b"\0" + payload, hashlib.sha256).digest()


def seal(key, name, payload):
    """The bytes of entry `name` holding `payload`."""
    return MAGIC + _mac(key, name, payload) + payload


def unseal(key, name, data):
    """The payload of entry `name`'s bytes, where its seal checks; EntryError otherwise."""
    head = len(MAGIC) + SEAL_BYTES
    if len(data) < head or not data.startswith(MAGIC):
        raise EntryError(f"{name}: not an entry of this cache's format")
    payload = data[head:]
    if not hmac.compare_digest(data[len(MAGIC):head], _mac(key, name, payload)):
        raise EntryError(f"{name}: its seal does not check (not written by this cache)")
    return payload


def load_executable(payload, in_tree, out_tree):
    """`serialize_executable.deserialize_and_load` of a sealed payload, its pickle allowed
    only JAX's, jaxlib's and numpy's classes."""
    import jax
    from jax.experimental import serialize_executable as se

    class _Unpickler(se._JaxPjrtUnpickler):
        def find_class(self, module, name):
            if module.split(".", 1)[0] not in ALLOWED_MODULES:
                raise EntryError(f"an entry names {module}.{name}")
            return super().find_class(module, name)

    backend = jax.devices()[0].client
    unloaded, args_info_flat, no_kwargs = _Unpickler(io.BytesIO(payload), backend).load()
    return jax.stages.Compiled(unloaded.load(), [], in_tree.unflatten(args_info_flat),
                               out_tree, no_kwargs=no_kwargs)


def write_entry(path, data, replace=True):
    """`data` into `path` through a temporary beside it, renamed over it (with `replace`;
    else `path` is written directly, created new); what was written is removed where
    anything fails (a full disk), and the error raised."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp" if replace else path
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
                  "wb") as f:
            f.write(data)
        if replace:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def trim(folder, max_bytes):
    """Drop the least recently used entries while the folder holds over `max_bytes`,
    temporaries counted; a temporary older than `STALE_TMP_SECONDS` (its writer died) is
    dropped whatever the total."""
    entries, total = [], 0
    now = time.time()
    with os.scandir(folder) as it:
        for e in it:
            try:
                if e.name == KEY_FILE or not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:   # renamed or dropped by another writer meanwhile
                continue
            if e.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_SECONDS:
                _remove(e.path)
                continue
            total += st.st_size
            entries.append((st.st_mtime, st.st_size, e.path))
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        if _remove(path):
            total -= size
    return total


def _remove(path):
    try:
        os.remove(path)
        return True
    except OSError:
        return False
