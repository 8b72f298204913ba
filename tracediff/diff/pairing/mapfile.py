"""The user's module map (`locate --map`, `tracediff.locate(map_file=...)`): which module of
a names which module of b, where the pairing cannot tell from the traces alone
(`{"MLP/fc1": "fc1"}`, `*` patterns). It comes from the command line, so it is read as
untrusted input: inline JSON or a regular JSON file, bounded in bytes, entries and pattern
length, and refused with a one-line error otherwise."""

import json
import os

from ...errors import TraceError

MAX_MAP_BYTES = 1 << 20      # a map names modules: a few lines, never megabytes
MAX_MAP_ENTRIES = 256         # each entry is matched against every unit of both traces
MAX_MAP_PATTERN = 1000        # characters of one pattern


def load_map(spec):
    """The user's module map {a pattern: b pattern}: `spec` is a dict, inline JSON (text
    starting with `{` that names no file: `--map '{"MLP/fc1": "fc1"}'`) or a JSON file.
    Bounded (MAX_MAP_BYTES, MAX_MAP_ENTRIES, MAX_MAP_PATTERN) and a file must be a regular
    file, refused at once otherwise (a FIFO would block the read forever)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        m, where = spec, "the map"
    else:
        spec = os.fspath(spec)
        if spec.lstrip().startswith("{") and not os.path.exists(spec):
            where = "the --map JSON"
            if len(spec.encode("utf-8", "surrogatepass")) > MAX_MAP_BYTES:
                raise TraceError(f"{where} is longer than the {MAX_MAP_BYTES >> 20} MiB a map "
                                 f"may hold")
            text = spec
        else:
            where, text = f"{spec}: the map file", _read_map_file(spec)
        try:
            m = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise TraceError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in m.items()):
        raise TraceError(f"{where} must be a JSON object of string to string "
                         f"(e.g. {{\"MLP/fc1\": \"fc1\"}})")
    if len(m) > MAX_MAP_ENTRIES:
        raise TraceError(f"{where} has {len(m):,} entries, more than the {MAX_MAP_ENTRIES} a "
                         f"map may hold (name modules, or use * patterns)")
    long = next((p for kv in m.items() for p in kv if len(p) > MAX_MAP_PATTERN), None)
    if long is not None:
        raise TraceError(f"{where} has a pattern of {len(long):,} characters, more than the "
                         f"{MAX_MAP_PATTERN} a pattern may hold")
    return dict(m)


def _read_map_file(path):
    """The text of a map file: a regular file of at most MAX_MAP_BYTES, opened without
    blocking (a FIFO or device is refused before anything is read)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the map file ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{path}: the map file is not a regular file (give a JSON file, "
                             f"or the JSON itself)")
        if st.st_size > MAX_MAP_BYTES:
            raise TraceError(f"{path}: the map file is {st.st_size:,} bytes, more than the "
                             f"{MAX_MAP_BYTES >> 20} MiB a map may hold")
        data = os.read(fd, MAX_MAP_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the map file ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_MAP_BYTES:
        raise TraceError(f"{path}: the map file is more than the {MAX_MAP_BYTES >> 20} MiB a "
                         f"map may hold")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: the map file is not valid JSON ({exc})") from None
