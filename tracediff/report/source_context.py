"""The user's code around the culprit's line, as a report shows it: the lines the trace
recorded, or with `--source-dir` the local file, read only when it is a regular file
inside that folder whose sha256 is the recorded one; and the words that say which
(`RECORDED`, `MATCHES`, `DIFFERS`, `NO_LINES`).
"""

import os

from ..trace import sources
from ..trace.sources import parse_source


# What a report says about the code context (report/markdown.py, html.py, terminal.py).
RECORDED = "recorded in the trace"
MATCHES = "local file matches the recorded sha256"
DIFFERS = "local file differs from the recorded one"
NO_LINES = "the trace holds no source lines for it"


def source_context(source, recorded=None, source_dir=None, manifest=None):
    """The user's lines around `source` ("file.py:25"), from the trace: {"file", "line",
    "lines": [(number, text)], "found", "origin", "note"}; None when `source` has no line
    number. Nothing on this machine is read unless `source_dir` is given.

    `recorded` is `Trace.source_lines(source)` (None for an older trace). With
    `source_dir`, the file is read from there only when it is a regular file inside the
    folder whose sha256 is the recorded one (the manifest's script sha256 for the script
    itself in an older trace); `note` says what happened, `origin` is "trace" or "local".
    Texts are the trace's (or the file's): renderers escape them."""

    parsed = parse_source(source)
    if parsed is None:
        return None
    fname, line = parsed
    out = {"file": fname, "line": line, "lines": [], "found": False, "origin": None,
           "note": None}
    if recorded and recorded.get("lines"):
        out.update(lines=list(recorded["lines"]), found=True, origin="trace")
    if source_dir is None:
        return out
    sha = (recorded or {}).get("sha256")
    if not sha:  # an older trace: the script itself has its sha256 in the manifest
        script = (manifest or {}).get("script") or {}
        if script.get("name") == fname and isinstance(script.get("sha256"), str):
            sha = script["sha256"].lower()
    lines, out["note"] = _local_lines(source_dir, fname, line, sha)
    if lines is not None:
        out.update(lines=lines, found=True, origin="local")
    return out


def _local_lines(source_dir, fname, line, sha):
    """([(number, text)] or None, note) for `fname` read from `source_dir` (see
    `source_context`): a relative path that stays inside the folder once symlinks are
    resolved, a regular file, at most MAX_FILE_BYTES, with the expected sha256."""
    import hashlib


    if os.path.isabs(fname) or fname.startswith("~"):
        return None, "not read: an absolute path"
    try:
        root = os.path.realpath(source_dir)
        path = os.path.realpath(os.path.join(root, fname))
    except (ValueError, OSError):  # a NUL byte, a symlink loop
        return None, "not read: not a valid path"
    if os.path.commonpath([root, path]) != root or path == root:
        return None, "not read: outside --source-dir"
    if not sha:
        return None, "not read: the trace records no sha256 for this file"
    try:
        data = sources.read_regular(path, follow=False)
    except sources.NotRegular:
        return None, "not read: not a regular file in --source-dir"
    except OSError:
        return None, "not read: no such file in --source-dir"
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        return None, DIFFERS
    got = sources.window(sources.split_lines(data), line)
    if got is None:
        return None, DIFFERS
    return [(got[0] + k, t) for k, t in enumerate(got[1])], MATCHES
