"""Python API: tracediff.record() (context manager and decorator), tracediff.load() with
events_table()/outputs(), tracediff.locate() with the same content as `locate --json`."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracediff
from tracediff.errors import TraceError
from tracediff.trace import schema

from . import synth
from .helpers import ROOT, run_cli

SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, jax.numpy as jnp
    import torch
    import tracediff

    out = sys.argv[1]

    @jax.jit
    def f(x):
        return jnp.tanh(x) * 2 + 1

    x = jnp.arange(4.0)
    f(x)                                   # compiled before any recording
    with tracediff.record(out + "/one.h5"):
        y = f(x)
    with tracediff.record(out + "/two.h5"):    # a second block in the same process
        y = f(x)

    @tracediff.record(out + "/deco.h5")
    def g(scale):
        return f(x * scale)

    g(1.0)
    try:
        with tracediff.record(out + "/boom.h5"):
            f(x)
            raise ValueError("boom")
    except ValueError:
        pass
    with tracediff.record(out + "/torch.h5", frameworks=("torch",)):
        t = torch.tanh(torch.ones(3)) * 2
    with tracediff.record(out + "/calls.h5", level="calls"):
        f(x)
    with tracediff.record(out + "/probe.h5", probe="^f$"):
        f(x)
    after = f(x)                           # unrecorded again: still the same numbers
    print(json.dumps({"after": [float(v) for v in after], "y": [float(v) for v in y],
                      "dynamo": "torch._dynamo" in sys.modules}))
''')


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api")
    script = folder / "api_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return folder, json.loads(proc.stdout.strip().splitlines()[-1])


def _ops(path):
    with tracediff.load(path) as t:
        table = t.events_table()
        return list(zip(table["kind"], table["op"], table["source"])), t.manifest


def test_record_block_captures_an_already_imported_framework(api_run):
    folder, out = api_run
    assert out["after"] == out["y"]
    events, manifest = _ops(folder / "one.h5")
    assert manifest["recording"]["tool"] == "tracediff.record()"
    assert manifest["end"]["status"] == "completed"
    assert manifest["script"]["name"] == "api_script.py"
    kinds_ops = [(k, o) for k, o, _ in events]
    assert ("call", "jit:f") in kinds_ops and ("eqn", "tanh") in kinds_ops
    call_src = [s for k, o, s in events if o == "jit:f"][0]
    assert call_src == "api_script.py:16"      # the with block's line, relative to the file
    assert set(manifest["frameworks"]["captured"]) == {"jax", "torch"}   # both imported


def test_eager_torch_recording_never_imports_dynamo(api_run):
    """torch wraps a dispatch mode for Dynamo, importing it (~2.5 CPU-s) at the first op;
    the recorder takes that wrapper only once the script has imported Dynamo itself
    (tests/test_torch_compile.py records scripts that do)."""
    folder, out = api_run
    assert out["dynamo"] is False
    events, _ = _ops(folder / "torch.h5")
    assert [o for k, o, _ in events if k == "op"][:2] == ["aten::ones", "aten::tanh"]


def test_successive_blocks_and_decorator_record_the_same(api_run):
    folder, _ = api_run
    one, _ = _ops(folder / "one.h5")
    two, _ = _ops(folder / "two.h5")
    deco, _ = _ops(folder / "deco.h5")
    assert [(k, o) for k, o, _ in one] == [(k, o) for k, o, _ in two]
    assert ("call", "jit:f") in [(k, o) for k, o, _ in deco]
    result = tracediff.locate(folder / "one.h5", folder / "two.h5")
    assert result.verdict == "match" and result.exit_code == 0
    assert result.first_difference is None


def test_exception_in_block_is_recorded_and_propagates(api_run):
    folder, _ = api_run
    events, manifest = _ops(folder / "boom.h5")
    assert manifest["end"]["status"] == "exception"
    assert manifest["end"]["exception"] == "ValueError" and manifest["end"]["message"] == "boom"
    assert ("call", "jit:f") in [(k, o) for k, o, _ in events]


def test_torch_block(api_run):
    folder, _ = api_run
    events, manifest = _ops(folder / "torch.h5")
    ops = [o for _, o, _ in events]
    assert "aten::tanh" in ops and any(o.startswith("aten::mul") for o in ops)
    assert manifest["frameworks"]["captured"] == ["torch"]


def test_locate_api_has_the_json_content(api_run):
    folder, _ = api_run
    a, b = folder / "one.h5", folder / "deco.h5"
    result = tracediff.locate(a, b, rtol=1e-3, atol=1e-6)
    proc = run_cli("locate", a, b, "--json", "--rtol", "1e-3", "--atol", "1e-6")
    cli = json.loads(proc.stdout)
    api = tracediff.to_json(result)
    assert proc.returncode == result.exit_code
    for key in ("verdict", "first_difference", "first_beyond_tolerance", "alignment", "env_diff",
                "optimizer_steps", "tolerance"):
        assert api[key] == cli[key], key


def test_record_options_as_the_cli(api_run):
    folder, _ = api_run
    rows, manifest = _ops(folder / "calls.h5")
    assert manifest["recording"]["level"] == "calls"
    assert [(k, op) for k, op, _ in rows] == [("call", "jit:f")]
    rows, manifest = _ops(folder / "probe.h5")
    assert manifest["recording"]["probe"] == "^f$"
    assert ("call", "probe:f") in [(k, op) for k, op, _ in rows]
    assert manifest["frameworks"]["jax"]["probe"]["final_outputs_equal_compiled"] == 1


def test_record_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown framework"):
        tracediff.record(tmp_path / "x.h5", frameworks=("tensorflow",))
    with pytest.raises(ValueError):
        tracediff.record(tmp_path / "x.h5", loops="sometimes")
    with pytest.raises(ValueError, match="unknown level"):
        tracediff.record(tmp_path / "x.h5", level="everything")
    with pytest.raises(ValueError, match="--probe"):
        tracediff.record(tmp_path / "x.h5", probe="(")
    with pytest.raises(TraceError, match="does not exist"):
        with tracediff.record(tmp_path / "no" / "such" / "x.h5"):
            pass


def _small_trace(tmp_path):
    x = np.ones((2, 3), np.float32)
    w = np.full((3, 4), 0.5, np.float32)
    return synth.write(str(tmp_path / "t.h5"), synth.mlp_events(x, w, steps=2)), x, w


def test_events_table_columns(tmp_path):
    path, x, w = _small_trace(tmp_path)
    with tracediff.load(path) as t:
        table = t.events_table()
        n = len(t)
        assert all(len(col) == n for col in table.values())
        assert table["index"].dtype == np.int64 and table["step"].dtype == np.int64
        for i in range(n):
            ev = t.event(i)
            for key in ("op", "kind", "framework", "phase", "origin", "name_stack", "source",
                        "step", "call", "parent"):
                assert table[key][i] == ev[key], (i, key)
        mm = int(np.flatnonzero(table["op"] == "aten::mm")[0])
        assert table["out_dtype"][mm] == "float32" and table["n_outputs"][mm] == 1
        outs = t.outputs(mm)
        np.testing.assert_array_equal(outs[0], x @ w)
        optim = int(np.flatnonzero(table["kind"] == "optim")[0])
        assert table["n_outputs"][optim] == 2 and len(t.outputs(optim)) == 2
        assert set(table["kind"]) <= set(schema.KIND_NAMES.values())


def test_events_table_makes_a_dataframe(tmp_path):
    import pandas as pd   # in the test extras: this test never skips
    path, _, _ = _small_trace(tmp_path)
    with tracediff.load(path) as t:
        table, n = t.events_table(), len(t)
    frame = pd.DataFrame(table)
    assert len(frame) == n and list(frame.columns)[:3] == ["index", "framework", "kind"]
