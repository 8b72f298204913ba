"""Code context comes from the trace, never from the disk of whoever opens it.

A trace names its culprit's `source` ("file.py:LINE"). Reports and `locate -v` used to
open that file on the reader's machine: a hostile source `/proc/self/environ:1` put the
environment into report.md, a FIFO hung the report, `/dev/zero` wrote megabytes. The
recorder now stores the lines around each call site and each file's sha256 in the trace
(`/sources`), the renderers show those, and a local file is read only with
`--source-dir DIR`: a regular file inside DIR whose sha256 matches the recorded one.
"""

import hashlib
import os
import shutil
import stat

import h5py
import numpy as np
import pytest
import xxhash
from click.testing import CliRunner

from tracediff.cli import main
from tracediff.trace.reader import Trace

from .helpers import FIXTURES, record_many, run_cli

DOT_LINE = "y = 2 * torch.dot(x, x)"
JAX_SCRIPT = """\
import jax
import jax.numpy as jnp

x = jnp.arange(4.0)
y = jnp.tanh(x)
f = jax.jit(lambda v: jnp.sin(v) * 2.0)
print(f(y))
"""
MARKER = "tdsecret-6f1c2e9a-marker"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """torch_dot.py and a tiny JAX script recorded from a folder deleted afterwards; b is
    a with the dot product's output changed (value bytes and hash), so that locate names
    `aten::dot` at torch_dot.py:6 as the culprit."""
    root = tmp_path_factory.mktemp("srcs")
    proj = root / "proj"
    proj.mkdir()
    shutil.copyfile(os.path.join(FIXTURES, "torch_dot.py"), proj / "torch_dot.py")
    (proj / "jax_tiny.py").write_text(JAX_SCRIPT)
    a, j = root / "a.h5", root / "j.h5"
    record_many({"torch": (str(proj / "torch_dot.py"), a, (), None),
                 "jax": (str(proj / "jax_tiny.py"), j, (), None)})
    shutil.rmtree(proj)   # the script's folder is not on the machine that reads the traces
    b = root / "b.h5"
    shutil.copyfile(a, b)
    with Trace(a) as t:
        dot = next(i for i in range(len(t)) if t.event(i)["op"] == "aten::dot")
    with h5py.File(b, "r+") as f:
        vals = f["values"][:]
        k = int(np.flatnonzero((vals["event"] == dot) & (vals["role"] == 0))[0])
        off = int(vals[k]["offset"])
        zero = np.zeros(1, np.float32).tobytes()
        f["blob"][off:off + 4] = np.frombuffer(zero, np.uint8)
        vals[k]["hash"] = xxhash.xxh3_64_intdigest(zero)
        f["values"][k] = vals[k]
    with open(os.path.join(FIXTURES, "torch_dot.py"), "rb") as fh:
        script = fh.read()
    return {"a": str(a), "b": str(b), "j": str(j), "dot": dot, "root": root, "script": script}


def _hostile(traces, name, source, edit=None):
    """A copy of trace a whose culprit (the dot op) has `source` as its source."""
    out = traces["root"] / f"{name}.h5"
    shutil.copyfile(traces["a"], out)
    with h5py.File(out, "r+") as f:
        n = int(f.attrs["committed_strings"])
        f["strings"].resize((n + 1,))
        f["strings"][n] = source
        f.attrs["committed_strings"] = n + 1
        ev = f["events"][:]
        ev[traces["dot"]]["source"] = n
        f["events"][:] = ev
        if edit is not None:
            edit(f)
    return str(out)


def _sources_row(traces, digest, text="x = 1"):
    """An edit for `_hostile`: a sources row for the culprit's new source, one recorded
    line `text` and `digest` as the file's sha256."""
    def edit(f):
        n = int(f.attrs["committed_strings"])
        f["strings"].resize((n + 2,))
        f["strings"][n] = text
        f["strings"][n + 1] = digest
        f.attrs["committed_strings"] = n + 2
        new = np.zeros(1, f["sources"].dtype)
        new["source"], new["first"], new["lines"], new["sha256"] = \
            f["events"][traces["dot"]]["source"], 1, n, n + 1
        k = int(f.attrs["committed_sources"])
        f["sources"].resize((k + 1,))
        f["sources"][k] = new[0]
        f.attrs["committed_sources"] = k + 1

    return edit


def _cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return res.exit_code, res.output


def _outputs(tmp_path, a, b, *extra):
    """(report.md, report.html, locate -v output), each run in-process."""
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    code, _ = _cli("report", a, b, "-o", md, *extra)
    assert code == 0
    code, _ = _cli("report", a, b, "-o", page, *extra)
    assert code == 0
    code, out = _cli("locate", "-v", "--no-explain", a, b, *extra)
    assert code == 1
    return md.read_text(), page.read_text(), out


# -- the recorded lines are shown ------------------------------------------------------------

def test_both_capture_paths_store_lines_and_file_hashes(traces):
    with Trace(traces["a"]) as t:
        got = t.source_lines("torch_dot.py:6")
    assert got["lines"] == [(4, "x = torch.arange(4.0)"), (5, "x.requires_grad_(True)"),
                            (6, DOT_LINE), (7, "y.backward()"), (8, "print(repr(y.item()))")]
    assert got["sha256"] == hashlib.sha256(traces["script"]).hexdigest()
    with Trace(traces["j"]) as t:
        sources = {t.event(i)["source"] for i in range(len(t))}
        # eager primitives (live frame), jit calls, and equations (jaxpr source info)
        assert {"jax_tiny.py:4", "jax_tiny.py:5", "jax_tiny.py:6", "jax_tiny.py:7"} <= sources
        eqn = t.source_lines("jax_tiny.py:6")
        assert eqn["lines"][2] == (6, "f = jax.jit(lambda v: jnp.sin(v) * 2.0)")
        assert eqn["lines"][0] == (4, "x = jnp.arange(4.0)") and len(eqn["lines"]) == 4
        assert eqn["sha256"] == hashlib.sha256(JAX_SCRIPT.encode()).hexdigest()
        # once per distinct file:line
        assert len(t.source_rows) == len({s for s in sources if s})


def test_reports_show_the_recorded_lines_when_the_script_is_gone(traces, tmp_path):
    md, page, out = _outputs(tmp_path, traces["a"], traces["b"])
    assert ("```python\n 4  x = torch.arange(4.0)\n 5  x.requires_grad_(True)\n"
            f">6  {DOT_LINE}\n 7  y.backward()\n 8  print(repr(y.item()))\n```") in md
    assert "Source (`torch_dot.py`, recorded in the trace):" in md
    assert "not on this machine" not in md
    assert f'<span class="hl">    6  {DOT_LINE}</span>' in page
    assert f"    >    6  {DOT_LINE}" in out and "         5  x.requires_grad_(True)" in out


def test_an_old_trace_without_sources_still_reads(traces, tmp_path):
    def drop(f):
        del f["sources"]
        del f.attrs["committed_sources"]

    old = _hostile(traces, "old", "torch_dot.py:6", drop)
    with Trace(old) as t:
        assert t.source_lines("torch_dot.py:6") is None and len(t.source_rows) == 0
    md, page, out = _outputs(tmp_path, old, traces["b"])
    assert "Source: `torch_dot.py:6` (the trace holds no source lines for it)" in md
    assert DOT_LINE not in md and DOT_LINE not in page and DOT_LINE not in out
    # with --source-dir, the script itself is checked against the manifest's sha256
    src = tmp_path / "src"
    src.mkdir()
    (src / "torch_dot.py").write_bytes(traces["script"])
    md, _, _ = _outputs(tmp_path, old, traces["b"], "--source-dir", src)
    assert f">6  {DOT_LINE}" in md and "local file matches the recorded sha256" in md


# -- hostile sources are never read ----------------------------------------------------------

def _no_leak(texts, *secrets):
    for text in texts:
        assert len(text) < 60_000
        for s in secrets:
            assert s not in text


def test_proc_environ_is_never_read(traces, tmp_path):
    bad = _hostile(traces, "environ", "/proc/self/environ:1")
    md = tmp_path / "r.md"
    proc = run_cli("report", bad, traces["b"], "-o", md, env={"TD_TOKEN": MARKER}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    with open("/proc/self/environ", "rb") as fh:
        entries = [e.decode(errors="replace") for e in fh.read().split(b"\0") if len(e) > 12]
    # in-process too: /proc/self/environ is then this process's environment
    texts = [md.read_text(), proc.stdout + proc.stderr, *_outputs(tmp_path, bad, traces["b"])]
    _no_leak(texts, MARKER, "TD_TOKEN", *entries)
    assert "Source: `/proc/self/environ:1` (the trace holds no source lines for it)" in texts[0]


def test_a_secret_file_named_by_the_trace_is_never_read(traces, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(f"token = {MARKER}\n")
    bad = _hostile(traces, "secret", f"{secret}:1")
    _no_leak(_outputs(tmp_path, bad, traces["b"]), MARKER)


def test_dev_zero_does_not_fill_the_report(traces, tmp_path):
    bad = _hostile(traces, "zero", "/dev/zero:1")
    md, page, out = _outputs(tmp_path, bad, traces["b"])
    _no_leak((md, page, out), "\0", "\\x00")


def test_a_fifo_does_not_hang_with_or_without_source_dir(traces, tmp_path):
    """The trace's script folder is recreated here holding only a FIFO named like the
    culprit's file: the old code opened it and waited forever for a writer."""
    proj = traces["root"] / "proj"
    proj.mkdir(exist_ok=True)
    fifo = proj / "fifo.py"
    os.mkfifo(fifo)
    try:
        bad = _hostile(traces, "fifo", "fifo.py:1")
        md = tmp_path / "r.md"
        proc = run_cli("report", bad, traces["b"], "-o", md, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "Source: `fifo.py:1` (the trace holds no source lines for it)" in md.read_text()
        # --source-dir opens only regular files, without blocking, even when the trace
        # records a sha256 for the name
        bad = _hostile(traces, "fifo2", "fifo.py:1", _sources_row(traces, "0" * 64))
        proc = run_cli("locate", "-v", "--no-explain", "--source-dir", proj, bad, traces["b"],
                       timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert "source: fifo.py:1" in proc.stdout
        assert "not read: not a regular file in --source-dir" in proc.stdout
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        shutil.rmtree(proj)



def test_recorded_lines_are_shown_as_text(traces, tmp_path):
    """The recorded lines are the trace's, so untrusted: a line holding terminal escapes,
    a bidi override, backticks and HTML is shown printable in every output (`\\x1b`),
    inside a fence it cannot end, and never as markup."""
    line = "x = 1  # \x1b[2J\x1b]0;pwned\x07\u202eRTL ```</code><script>alert(1)</script>"
    bad = _hostile(traces, "escapes", "evil.py:1", _sources_row(traces, "0" * 64, line))
    md, page, out = _outputs(tmp_path, bad, traces["b"])
    for text in (md, page, out):
        assert not [c for c in ("\x1b", "\x07", "\u202e") if c in text]
    shown = r"x = 1  # \x1b[2J\x1b]0;pwned\x07\u202eRTL ```</code><script>alert(1)</script>"
    assert f">1  {shown}" in md and "````python" in md     # a fence longer than its backticks
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and f"{shown}" in out


# -- --source-dir ----------------------------------------------------------------------------

def test_source_dir_with_the_recorded_file_shows_it(traces, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "torch_dot.py").write_bytes(traces["script"])
    md, page, out = _outputs(tmp_path, traces["a"], traces["b"], "--source-dir", src)
    assert f">6  {DOT_LINE}" in md and f'<span class="hl">    6  {DOT_LINE}</span>' in page
    for text in (md, page, out):
        assert "local file matches the recorded sha256" in text
    assert f"    >    6  {DOT_LINE}" in out


def test_source_dir_with_a_modified_file_says_it_differs(traces, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "torch_dot.py").write_bytes(traces["script"].replace(b"2 * torch", b"3 * torch  # edited"))
    md, page, out = _outputs(tmp_path, traces["a"], traces["b"], "--source-dir", src)
    for text in (md, page, out):
        assert "local file differs from the recorded one" in text and "edited" not in text
    assert f">6  {DOT_LINE}" in md and f"    >    6  {DOT_LINE}" in out


def test_source_dir_refuses_paths_that_leave_it(traces, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    above = tmp_path / "above.py"
    above.write_text(f"token = '{MARKER}'\n")
    (src / "link.py").symlink_to(above)
    digest = hashlib.sha256(above.read_bytes()).hexdigest()
    for name, source, why in [("up", "../above.py:1", "outside --source-dir"),
                              ("abs", f"{above}:1", "an absolute path"),
                              ("link", "link.py:1", "outside --source-dir")]:
        # even with a sources row that carries the file's real sha256
        bad = _hostile(traces, name, source, _sources_row(traces, digest))
        texts = _outputs(tmp_path, bad, traces["b"], "--source-dir", src)
        _no_leak(texts, MARKER)
        for text in texts:
            assert f"not read: {why}" in text, (name, text[-2000:])
