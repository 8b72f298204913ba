"""The user's source lines, recorded with the trace and read back safely.

Reports show the code around the culprit. They used to open the file a trace names on
the machine of whoever opens the report, and a trace is untrusted: a source of
`/proc/self/environ:1` put the reader's environment into the report, a FIFO hung it,
`/dev/zero` filled it. So the recorder stores the lines around each call site (once per
distinct `file:LINE` string, when the writer first interns it) and the sha256 of each
file it read, in the trace's `sources` table; reports show those. A local file is read
only on request (`--source-dir`), and then only through `read_regular` and only when its
sha256 matches the recorded one (report/source_context.py).
"""

import hashlib
import io
import os
import stat
import tokenize

CONTEXT = 2                  # lines stored on each side of the call site
MAX_LINE = 240               # characters kept of one line
MAX_FILE_BYTES = 16 << 20    # larger files are not read (no lines, no sha256)
MAX_SOURCES = 20_000         # rows per trace; a generated program may have more call sites


class NotRegular(OSError):
    """The path is not a regular file (FIFO, device, directory, socket)."""


def read_regular(path, limit=MAX_FILE_BYTES, follow=True):
    """The bytes of `path` if it is a regular file of at most `limit` bytes, else None.

    Opened non-blocking (a FIFO never blocks the open), checked with fstat on the open
    descriptor (no race with a rename), read with a bound; with follow=False a symlink
    as the last component is refused (O_NOFOLLOW). Raises OSError when it cannot be
    opened and NotRegular for anything but a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NOCTTY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path}: not a regular file")
        if st.st_size > limit:
            return None
        chunks, total = [], 0
        while total <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
        return None if total > limit else b"".join(chunks)
    finally:
        os.close(fd)


def split_lines(data):
    """The text lines of Python source bytes, numbered as Python numbers them (its coding
    cookie honoured; "\\r\\n", "\\r" and "\\n" end a line, nothing else does)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    try:
        text = data.decode(encoding, "replace")
    except LookupError:
        text = data.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":   # the newline ending the last line starts no line
        lines.pop()
    return lines


def cut(line, limit=MAX_LINE):
    line = line.rstrip()
    return line if len(line) <= limit else line[:limit - 1] + "…"


def window(lines, line, context=CONTEXT):
    """(first line number, [text]) of the lines around `line` (1-based), or None."""
    if not 1 <= line <= len(lines):
        return None
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return lo, [cut(lines[i - 1]) for i in range(lo, hi + 1)]


# An op recorded inside library code (torch.nn, flax, transformers, a pip package) has
# events.source "LIB ← USER": the innermost frame (the library's line) and the innermost
# frame of the user's code. USER is the primary site (`source` everywhere a trace is read:
# "where in MY code"), LIB is shown beside it (`lib_source`). An op of the user's own code
# has USER alone, as before; an older reader shows the whole string and USER's lines.
LIB_SEP = " \u2190 "


def join_site(user, lib):
    """The events.source string of an op: USER, or "LIB ← USER" when they differ (LIB
    alone when no frame is the user's)."""
    if lib is None or lib == user:
        return user
    if user is None:
        return lib
    return f"{lib}{LIB_SEP}{user}"


def split_site(source):
    """(user site, library site or "") of an events.source string."""
    if not isinstance(source, str) or LIB_SEP not in source:
        return source, ""
    lib, _, user = source.rpartition(LIB_SEP)
    return user, lib


def parse_source(source):
    """("file.py", LINE) of an events.source string (its user site), or None without a
    line number."""
    source = split_site(source)[0]
    if not isinstance(source, str) or ":" not in source:
        return None
    fname, _, line = source.rpartition(":")
    if not fname or not line.isdigit() or len(line) > 9:
        return None
    return fname, int(line)


class SourceRecorder:
    """`writer.source_lines`: called once per new source string of a recording; returns
    (first line number, lines joined with "\\n", file sha256) or None. Each file is read
    once (a bounded read of a regular file) and kept as lines until the recording ends."""

    def __init__(self, folder):
        self.folder = folder   # () -> the script's folder or None (known once the run starts)
        self._files = {}   # file as named in sources -> (lines, sha256), or None
        self.rows = 0

    def path(self, fname):
        """The file an events.source names: `Session.short_path` made it relative to the
        script's folder when inside it, and left it as Python named it otherwise."""
        folder = self.folder()
        if folder and not os.path.isabs(fname):
            return os.path.join(folder, fname)
        return fname

    def __call__(self, source):
        if self.rows >= MAX_SOURCES:
            return None
        parsed = parse_source(source)
        if parsed is None:
            return None
        fname, line = parsed
        entry = self._files.get(fname, False)
        if entry is False:
            path = self.path(fname)
            entry = self._read(path)
            if entry is None and path != fname:   # a relative name Python resolved
                entry = self._read(fname)         # against the working directory
            self._files[fname] = entry
        if entry is None:
            return None
        lines, sha = entry
        got = window(lines, line)
        if got is None:
            return None
        self.rows += 1
        return got[0], "\n".join(got[1]), sha

    @staticmethod
    def _read(path):
        if path.startswith("<"):   # <stdin>, <string>, <frozen ...>: no file
            return None
        try:
            data = read_regular(path)
        except OSError:
            return None
        if data is None:
            return None
        return split_lines(data), hashlib.sha256(data).hexdigest()
