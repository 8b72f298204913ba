"""HF transformers 4.57.6 BERT, torch and Flax (tests/field/programs/hf_capture_bert.py): what the
recording captures and how the two sides' names are shown (issue #26, items 1 and 3, and
the source-line and environment bullets).

transformers looks frameworks up with `importlib.util.find_spec` before it imports them:
the trace must still hold every op of both. Each recording runs in a fresh interpreter
(the test zygotes would import the frameworks before the script). Truths come from the
script's own outputs, the config's arithmetic, transformers' source files and the bug
the test injects, never from tracediff."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tracediff
from tracediff.trace import schema
from tracediff.trace.reader import Trace

from ..helpers import ROOT, run_cli, script_env

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs",
                      "hf_capture_bert.py")
LAYERS = 2
DENSE = LAYERS * 6 + 1        # query, key, value, attention output, intermediate, output; pooler


def _record(out, folder, *args):
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", str(out), SCRIPT,
                           str(folder), *args], env=script_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_capture")
    out = {}
    for name, args in (("one", ()), ("qk", ("--swap-qk",)),
                       ("qk_sdpa", ("--swap-qk", "--attn", "sdpa")), ("torch", ("--side", "torch")),
                       ("flax", ("--side", "flax"))):
        folder = d / ("two" if name in ("torch", "flax") else name)
        folder.mkdir(exist_ok=True)
        proc = _record(d / f"{name}.h5", folder, *args)
        out[name] = {"trace": d / f"{name}.h5", "folder": folder, "stderr": proc.stderr}
    return out


def _sources(path, fw, op, stack_end):
    with Trace(str(path)) as t:
        return [t.event(e) for e in range(len(t))
                if t.events["framework"][e] == fw and t.string(t.events["op"][e]) == op
                and t.string(t.events["name_stack"][e]).endswith(stack_end)]


def _line_of(module_file, text):
    import transformers

    path = os.path.join(os.path.dirname(transformers.__file__), "models", "bert", module_file)
    with open(path, encoding="utf-8") as fh:
        return {i + 1 for i, ln in enumerate(fh) if text in ln}


def test_one_process_records_every_op_of_both(runs):
    run = runs["one"]
    assert "WARNING" not in run["stderr"]
    flax_out, torch_out = (np.load(run["folder"] / f"{s}.npy") for s in ("flax", "torch"))
    with Trace(str(run["trace"])) as t:
        fws = t.manifest["frameworks"]
        assert sorted(fws["captured"]) == ["jax", "torch"] and "missed" not in fws
        ev = t.events
        jax_ev = np.flatnonzero(ev["framework"] == schema.FW_JAX)
        dense = [e for e in jax_ev.tolist() if t.string(ev["op"][e]) == "dot_general" and
                 re.search(r"/(query|key|value|dense)$", t.string(ev["name_stack"][e]))]
        assert len(dense) == DENSE, len(dense)
        # the script's results are among the recorded values, bitwise
        def holds(ids, want):
            for e in ids:
                for x in t.outputs(e):
                    if x is not None and np.shape(x) == want.shape and \
                            np.asarray(x).tobytes() == want.tobytes():
                        return True
            return False
        assert holds(jax_ev.tolist()[::-1], flax_out)
        assert holds(np.flatnonzero(ev["framework"] == schema.FW_TORCH).tolist()[::-1], torch_out)
    # one trace holding both frameworks: locate compares them (it said "holds torch")
    proc = run_cli("locate", run["trace"], "--json")
    assert proc.returncode in (0, 1), proc.stderr
    d = json.loads(proc.stdout)
    assert (d["traces"]["a"]["framework"], d["traces"]["b"]["framework"]) == ("jax", "torch")


def test_sources_name_the_modeling_frame(runs):
    """A Dense inside FlaxBertSelfAttention: `flax/linen/linear.py:N <- modeling_flax_bert.py:M`
    with M the line of `self.query(` (the layer's line, not the script's `model(...)`);
    torch's Linear likewise names modeling_bert.py."""
    trace = runs["one"]["trace"]
    fx = _sources(trace, schema.FW_JAX, "dot_general", "layer/0/attention/self/query")
    pt = _sources(trace, schema.FW_TORCH, "aten::addmm", "layer.0.attention.self.query")
    assert fx and pt
    for ev, module_file, lib in ((fx[-1], "modeling_flax_bert.py", "flax/linen/linear.py"),
                                 (pt[-1], "modeling_bert.py", "torch/nn/modules/linear.py")):
        path, _, line = ev["source"].rpartition(":")
        assert path.endswith("models/bert/" + module_file), ev
        assert int(line) in _line_of(module_file, "self.query("), ev
        assert lib in ev["lib_source"], ev


def test_modules_map_themselves_and_a_qk_swap_is_named(runs):
    r = tracediff.locate(str(runs["one"]["trace"]), explain=False)
    named = [m for m in r.mapping if m["family"] in ("linear", "layer_norm", "gather")]
    assert named and not [m for m in named if m["names_cross"]]
    assert all(m["module_rule"] == "root FlaxBertModule dropped" for m in named), \
        [(m["a_module"], m["b_module"]) for m in named if m["module_rule"] is None]
    r = tracediff.locate(str(runs["qk"]["trace"]), explain=False)
    crossed = {(m["a_module"], m["b_module"]): m["names_cross"] for m in r.mapping
               if m["family"] == "linear" and m["names_cross"]}
    base = "encoder/layer/1/attention/self/"
    assert crossed == {("FlaxBertModule/" + base + "query", base + "key"):
                       "values of query pair with key's",
                       ("FlaxBertModule/" + base + "key", base + "query"):
                       "values of key pair with query's"}
    proc = run_cli("locate", runs["qk"]["trace"], "--no-explain", env={"NO_COLOR": "1"})
    assert "modules paired by name:" in proc.stdout
    assert "names cross: values of query pair with key's" in proc.stdout


def test_two_scripts_no_one_sided_library_difference(runs):
    """transformers imports both frameworks in each script; scipy's extension modules
    (`_decomp_interpolative`) are loaded in one of them only: no environment difference."""
    with Trace(str(runs["flax"]["trace"])) as ta, Trace(str(runs["torch"]["trace"])) as tb:
        la, lb = set(ta.manifest.get("libraries") or {}), set(tb.manifest.get("libraries") or {})
        assert la ^ lb                        # the case is there: one-sided libraries
    proc = run_cli("locate", runs["flax"]["trace"], runs["torch"]["trace"], "--json",
                   "--no-explain")
    assert proc.returncode in (0, 1), proc.stderr
    env = json.loads(proc.stdout)["env_diff"]
    one_sided = [e["key"] for e in env if e["key"].startswith("libraries.")
                 and (e["a"] is None or e["b"] is None)]
    assert one_sided == []


def test_qk_swap_finding_says_upstream_values_cross_names(runs):
    """SDPA attention: the swap is found at layer 1's attention (where the injected swap
    is), and the finding says the values it reads pair across names."""
    r = tracediff.locate(str(runs["qk_sdpa"]["trace"]), explain=False)
    f = r.first_beyond_tolerance
    assert f is not None
    assert f.layer["b_module"] == "encoder/layer/1/attention/self", f.layer
    assert f.layer["a_module"].startswith("FlaxBertModule/encoder/layer/1/attention/self"), f.layer
    assert "upstream values pair across names: values of query pair with key's" in f.note, f.note
