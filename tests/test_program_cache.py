"""tracediff's own XLA programs kept compiled between runs (capture/jax/program_cache.py): a
second recording of the same script loads the values and digest programs the first one
compiled, and writes the same trace; a file that is not a loadable program is compiled
again; a folder others may write to is never read. The device path is forced on XLA:CPU
(as on a TPU: the values program hashes and summarises every equation's outputs)."""

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
    loss = jnp.mean((h - 1.0) ** 2)
    return w - 0.1 * jax.grad(lambda v: jnp.mean((jnp.tanh(x @ v) - 1.0) ** 2))(w), loss

w = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)
x = jnp.cos(jnp.arange(32, dtype=jnp.float32)).reshape(4, 8)
for _ in range(3):
    w, loss = step(w, x)
print("loss", float(loss), "sum", float(w.sum()))
"""


def _env(folder):
    # without the suite's JAX compilation cache (conftest.py), which would hold them instead
    return {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1", "TRACEDIFF_XLA_CACHE": str(folder),
            "JAX_COMPILATION_CACHE_DIR": ""}


def _record(tmp_path, name, folder):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = str(tmp_path / f"{name}.h5")
    proc = record(str(script), out, env=_env(folder),
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
