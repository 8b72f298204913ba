"""tracediff's own XLA programs kept compiled between runs (capture/jax/program_cache.py,
cache_entries.py): a second recording of the same script loads the values and digest
programs the first one compiled, and writes the same trace; an entry filled under one
JAX or XLA setting is never handed back under another (each recording equals a cache-off
recording under its setting); a file that is not a sealed entry of this cache (garbage, a
planted pickle, a FIFO, a link to a device) is compiled again, never loaded, and never
blocks; a folder others may write to, or under a folder others may write to, is never
read; JAX's own persistent cache takes the programs where it is on; the trim drops the
oldest entries first and counts temporaries; a failed write leaves none. The device path
is forced on XLA:CPU (as on a TPU: the values program hashes and summarises every
equation's outputs)."""

import json
import os
import textwrap

import h5py
import numpy as np
import pytest

from .helpers import record

pytestmark = pytest.mark.deep

pytest.importorskip("jax")

SCRIPT = """
import jax, jax.numpy as jnp

@jax.jit
def step(w, x):
    h = jnp.tanh(x @ w)
    loss = jnp.mean((h - 1.0) ** 2) + jnp.sum(jnp.log1p(h * h)) * 1e-3
    return w - 0.1 * jax.grad(lambda v: jnp.mean((jnp.tanh(x @ v) - 1.0) ** 2))(w), loss

w = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)
x = jnp.cos(jnp.arange(32, dtype=jnp.float32)).reshape(4, 8)
for _ in range(3):
    w, loss = step(w, x)
print("loss", float(loss), "sum", float(w.sum()))
"""


def _env(folder, setting=None):
    # without the suite's JAX compilation cache (conftest.py), which would hold them instead
    return {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1", "TRACEDIFF_XLA_CACHE": str(folder),
            "JAX_COMPILATION_CACHE_DIR": "", **(setting or {})}


def _record(tmp_path, name, folder, setting=None):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = str(tmp_path / f"{name}.h5")
    proc = record(str(script), out, env=_env(folder, setting),
                  extra=("--level", "stats", "--jax-values", "compiled"))
    with h5py.File(out) as f:
        manifest = json.loads(f["manifest"][()])
        rows = {k: np.asarray(f[k]) for k in ("values", "stats")}
    return proc.stdout, manifest["frameworks"]["jax"]["program_cache"], rows


def _same_rows(a, b):
    """Equal values rows, and statistics rows equal value by value (a device path's rows
    are written as their results are read: in another order from run to run)."""
    a, b = dict(a), dict(b)
    for rows in (a, b):
        rows["stats"] = np.sort(rows["stats"], order="value")
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), f"{k} rows differ"


def test_a_second_recording_loads_the_programs_and_writes_the_same_trace(tmp_path):
    folder = tmp_path / "xla"
    out1, first, rows1 = _record(tmp_path, "first", folder)
    assert first["folder"] == str(folder) and not first["errors"]
    assert first["compiled"] >= 2 and first["stored"] == first["compiled"]
    assert len(list(folder.glob("*.xla"))) == first["stored"]
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"

    out2, second, rows2 = _record(tmp_path, "second", folder)
    assert second["compiled"] == 0 and second["stored"] == 0 and not second["errors"]
    assert second["loaded"] == first["compiled"] + first["loaded"]
    assert out2 == out1                      # the script's own output
    _same_rows(rows1, rows2)                 # every hash and statistic


def test_a_file_that_is_not_a_program_is_compiled_again(tmp_path):
    folder = tmp_path / "xla"
    out1, first, rows1 = _record(tmp_path, "first", folder)
    for f in folder.glob("*.xla"):
        f.write_bytes(b"not an executable")
    out2, second, rows2 = _record(tmp_path, "second", folder)
    # every program compiled again (and stored over the bad file; a twin program of the
    # same run loads the fresh file, as in the first run)
    assert second["compiled"] == first["compiled"] and second["loaded"] == first["loaded"]
    assert any(e.startswith("load:") for e in second["errors"])
    assert out2 == out1
    _same_rows(rows1, rows2)


def test_a_folder_others_may_write_to_is_never_read(tmp_path):
    folder = tmp_path / "xla"
    folder.mkdir()
    folder.chmod(0o777)
    out, got, _ = _record(tmp_path, "shared", folder)
    assert got["folder"] is None and got["loaded"] == 0 and got["stored"] == 0
    assert got["compiled"] >= 2
    assert any("writable by others" in e for e in got["errors"])
    assert not list(folder.glob("*.xla"))
    assert out.startswith("loss ")


# settings that change what XLA compiles from the same program text
SETTINGS = {"no_opt": {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"},
            "isa": {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
            "precision": {"JAX_DEFAULT_MATMUL_PRECISION": "highest"}}


def test_an_entry_filled_under_one_setting_is_never_handed_back_under_another(tmp_path):
    """The cache filled at defaults, then a recording under each setting with it, and one
    without any cache: the same rows (a stale entry gave 6 rows the script's program never
    computed under JAX_DISABLE_MOST_OPTIMIZATIONS), and programs compiled, not loaded."""
    folder = tmp_path / "xla"
    _, filled, _ = _record(tmp_path, "defaults", folder)
    assert filled["stored"] >= 2
    for name, setting in SETTINGS.items():
        out_on, on, rows_on = _record(tmp_path, f"{name}-cache", folder, setting)
        out_off, off, rows_off = _record(tmp_path, f"{name}-off", "off", setting)
        assert off["folder"] is None and on["folder"] == str(folder)
        assert on["compiled"] >= 2 and not on["errors"], (name, on)
        assert out_on == out_off, name
        _same_rows(rows_on, rows_off)


def _fill(tmp_path):
    folder = tmp_path / "xla"
    out, first, rows = _record(tmp_path, "first", folder)
    entries = sorted(folder.glob("*.xla"))
    assert len(entries) == first["stored"] >= 2
    return folder, out, first, rows, entries


class _Planted:
    """A pickle that, once loaded, leaves a file behind: what a planted entry would run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_is_never_loaded(tmp_path):
    import pickle

    folder, out1, first, rows1, entries = _fill(tmp_path)
    marker = tmp_path / "pwned"
    for f in entries:   # at every name a program of this script is looked up by
        f.write_bytes(pickle.dumps(_Planted(str(marker))))
    out2, second, rows2 = _record(tmp_path, "second", folder)
    assert not marker.exists()
    assert second["loaded"] == first["loaded"] and second["compiled"] == first["compiled"]
    assert any("not an entry of this cache's format" in e for e in second["errors"])
    assert out2 == out1
    _same_rows(rows1, rows2)


def test_an_entry_sealed_for_another_name_is_not_loaded(tmp_path):
    """An entry is bound to its name: a real entry of one program copied over another's
    fails its seal (it would be another executable)."""
    folder, out1, first, rows1, entries = _fill(tmp_path)
    data = [f.read_bytes() for f in entries]
    for f, d in zip(entries, data[1:] + data[:1]):
        f.write_bytes(d)
    out2, second, rows2 = _record(tmp_path, "second", folder)
    assert second["compiled"] == first["compiled"]
    assert any("seal does not check" in e for e in second["errors"])
    _same_rows(rows1, rows2)


def test_a_fifo_a_folder_or_a_link_to_a_device_is_no_entry(tmp_path):
    """A FIFO made the recording hang after "trace written"; a link to /dev/zero was read
    until memory ran out; a folder stopped the recording (IsADirectoryError): none is read
    beyond its type."""
    folder, out1, first, rows1, entries = _fill(tmp_path)
    for i, f in enumerate(entries):
        f.unlink()
        if i % 3 == 0:
            os.mkfifo(f)
        elif i % 3 == 1:
            f.symlink_to("/dev/zero")
        else:
            f.mkdir()
    out2, second, rows2 = _record(tmp_path, "second", folder)
    assert second["compiled"] == first["compiled"] and second["loaded"] == first["loaded"]
    assert any("not a regular file" in e for e in second["errors"])
    _same_rows(rows1, rows2)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=oct)
def test_a_folder_its_group_or_others_may_write_to_is_never_read(tmp_path, mode):
    """Sticky bit or not (0o1777, as /tmp): the sticky bit only keeps others from renaming
    what is ours in a folder above; in the cache folder itself they could still add files
    (the sealing key first)."""
    folder = tmp_path / "xla"
    folder.mkdir()
    folder.chmod(mode)
    _, got, _ = _record(tmp_path, "shared", folder)
    assert got["folder"] is None and got["stored"] == 0
    assert any("writable by others" in e for e in got["errors"])


def test_a_folder_under_one_others_may_write_to_is_never_read(tmp_path):
    """Whoever may write to a folder above it may put another folder in its place."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)   # no sticky bit: anyone may rename what is in it
    _, got, _ = _record(tmp_path, "below", open_dir / "xla")
    assert got["folder"] is None and got["stored"] == 0
    assert any(f"{open_dir} is writable by others" in e for e in got["errors"])


def test_jax_own_cache_takes_the_programs_where_it_is_on(tmp_path):
    folder, jax_dir = tmp_path / "xla", tmp_path / "jax"
    _, got, _ = _record(tmp_path, "jax", folder, {"JAX_COMPILATION_CACHE_DIR": str(jax_dir)})
    assert got["folder"] is None and got["jax_cache_folder"] == str(jax_dir)
    assert got["stored"] == 0 and not list(folder.glob("*.xla"))


def test_the_trim_drops_the_oldest_first_and_counts_temporaries(tmp_path):
    import time

    from tracediff.capture.jax import cache_entries

    folder = tmp_path / "xla"
    folder.mkdir(mode=0o700)
    now = int(time.time()) - 100
    for i, name in enumerate(["a.xla", "b.xla", "c.xla.1.ab.tmp", "d.xla"]):
        (folder / name).write_bytes(b"x" * 100)
        os.utime(folder / name, (now + i, now + i))   # a oldest, d newest
    (folder / "stale.xla.2.cd.tmp").write_bytes(b"x" * 10)
    os.utime(folder / "stale.xla.2.cd.tmp", (0, 0))    # its writer died long ago
    assert cache_entries.trim(folder, 250) == 200
    assert sorted(p.name for p in folder.iterdir()) == ["c.xla.1.ab.tmp", "d.xla"]
    # a folder holding exactly the bound is within it: nothing more is dropped
    assert cache_entries.trim(folder, 200) == 200
    assert sorted(p.name for p in folder.iterdir()) == ["c.xla.1.ab.tmp", "d.xla"]


def test_a_write_that_fails_leaves_no_temporary(tmp_path):
    """A full disk (here the file size limit) fails the write: the error is raised and the
    temporary removed."""
    import subprocess
    import sys

    folder = tmp_path / "xla"
    folder.mkdir(mode=0o700)
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "from tracediff.capture.jax.cache_entries import write_entry\n"
            "try:\n    write_entry(sys.argv[1], b'x' * 100000)\n"
            "except OSError as exc:\n    print('failed', exc.errno)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(folder / "e.xla")],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("failed"), proc.stderr
    assert list(folder.iterdir()) == []
