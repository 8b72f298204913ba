"""Opening a file the user named for output (`show --npy`, `report -o`, `check --report`)
never through a symbolic link.

The path may be a link the user did not mean: left in a shared folder, or made to point at
a file they care about. Writing through it would replace that file. So a link (a dangling
one too) is refused in one line unless `--force`, which replaces the link itself, and the
file is opened with O_NOFOLLOW, so a link made between the check and the open is refused
as well. An existing regular file (or a device such as /dev/full) is written as before.
`slice` and `repro` refuse any existing path without `--force` (their own checks).
"""

import errno
import os

from .errors import TraceError


def _refuse(path):
    return TraceError(f"{path} is a symbolic link; give --force to replace the link (the file "
                      f"it points to is never written)")


def check_link(path, force=False):
    """TraceError when `path` is a symbolic link and not `force` (before any work is done)."""
    if os.path.islink(path) and not force:
        raise _refuse(path)


def open_output(path, force=False):
    """A binary file object writing `path`, never through a link (see the module)."""
    check_link(path, force)
    if os.path.islink(path):
        try:
            os.unlink(path)
        except OSError as exc:
            raise TraceError(f"cannot replace {path}: {exc.strerror or exc}") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path) from None
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None
    return os.fdopen(fd, "wb")
