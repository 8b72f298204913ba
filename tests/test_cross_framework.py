"""Cross-framework `locate`: a Flax trace against a PyTorch trace of the same model
(fixtures/flax_dense.py, fixtures/torch_linear.py: same seeded weights, weight = kernel.T)."""

import json
import os

import pytest

import tracediff
from tracediff.diff.pairing.cross import op_family
from tracediff.diff.differ import BITWISE
from tracediff.diff.locate import open_differ

from .conftest import TF32_ADDMM
from .helpers import run_cli


def test_op_families():
    assert op_family("dot_general") == op_family("aten::mm") == "matmul"
    assert op_family("aten::addmm") == op_family("aten::linear") == "linear"
    assert op_family("aten::add.Tensor") == op_family("add") == "add"
    assert op_family("max") == op_family("aten::relu") == "max"
    assert op_family("logistic") == op_family("aten::sigmoid")
    assert op_family("concatenate") == op_family("aten::cat") == "concatenate"
    for passthrough in ("aten::t", "reshape", "stage", "aten::copy_", "broadcast_in_dim", "jit:add"):
        assert op_family(passthrough) is None


@pytest.fixture(scope="module")
def traces(recorded):
    return recorded.many({"flax": ("flax_dense.py", (), None),
                          "torch": ("torch_linear.py", (), None),
                          "torch_tf32": ("torch_linear.py", (), TF32_ADDMM),
                          "flax_mlp": ("flax_dense.py", ("--mlp", "--jit"), None),
                          "torch_mlp": ("torch_linear.py", ("--mlp",), None)})


def _by(d):
    return sorted(m["by"] for m in d["mapping"])


def test_dense_vs_tf32_linear_inputs_match_matmul_differs(traces):
    proc = run_cli("locate", traces["flax"], traces["torch_tf32"], "--json")
    assert proc.returncode == 1, proc.stderr
    d = json.loads(proc.stdout)
    f = d["first_beyond_tolerance"]
    assert d["verdict"] == "diverged"
    assert f["a"]["framework"] == "jax" and f["b"]["framework"] == "torch"
    assert f["a"]["op"] == "add" and f["a"]["name_stack"] == "MLP/fc0"
    assert f["b"]["op"].startswith("aten::addmm")
    assert f["inputs_match"] is True and "inputs and parameters match" in f["inputs_reason"]
    assert "dot_general + add" in f["note"] and "linear" in f["note"]
    assert 1e-4 < f["metrics"]["max_abs"] < 1e-1 and f["metrics"]["mismatch_fraction"] > 0.5
    # input, kernel (= weight.T) and bias are paired by value; the layer by dataflow
    assert _by(d) == ["dataflow", "value", "value", "value"]
    lin = next(m for m in d["mapping"] if m["by"] == "dataflow")
    assert lin["family"] == "linear" and lin["b_op"] == "addmm"
    # different scripts are expected across frameworks: no warning
    assert "different scripts" not in proc.stderr
    # the frameworks' own differences lead: their configuration, packages, native libraries,
    # and the TF32 perturbation's sitecustomize (libraries each framework loads on its own
    # side only are no difference: docs/ports.md)
    assert d["env_diff"][0]["category"] in ("jax-config", "torch-config", "package", "library",
                                            "startup")
    proc = run_cli("locate", traces["flax"], traces["torch_tf32"], env={"NO_COLOR": "1"})
    assert "introduced here" in proc.stdout and "aten::addmm" in proc.stdout
    assert "pairs matched by: dataflow 1, value 3" in proc.stdout


def test_dense_vs_linear_same_machine(traces):
    r = tracediff.locate(str(traces["flax"]), str(traces["torch"]))
    d = tracediff.to_json(r)
    assert _by(d) == ["dataflow", "value", "value", "value"]
    # the Dense unit reads x, kernel (= weight.T) and bias: each paired with the Linear's
    # and bitwise equal, whatever the matmul then does
    lin = next(m for m in d["mapping"] if m["by"] == "dataflow")
    with tracediff.load(str(traces["flax"])) as ta, tracediff.load(str(traces["torch"])) as tb:
        differ, _ = open_differ(ta, tb)
        match, reason, bad = differ.inputs_match(lin["a"], lin["b"], BITWISE)
    assert match is True and reason.startswith("all 3 inputs and parameters match (bitwise)"), reason
    assert "via aten::t" in reason      # the kernel is paired with weight.t()
    # whatever the BLAS does here, a difference can only be introduced at the linear unit
    for f in (d["first_difference"], d["first_beyond_tolerance"]):
        if f is not None:
            assert f["b"]["op"].startswith("aten::addmm") and f["inputs_match"] is True


def test_mlp_pairs_every_layer_and_activation(traces, tmp_path):
    r = tracediff.locate(str(traces["flax_mlp"]), str(traces["torch_mlp"]))
    fams = sorted(m["family"] for m in r.mapping if m["by"] == "dataflow")
    assert fams == ["linear", "linear", "linear", "max", "tanh"]
    f = r.first_difference
    if f is not None:  # on this CPU: tanh differs by a few ulp, with identical inputs
        assert f.inputs_match is True
        assert f.b["op"].split(".")[0] in ("aten::addmm", "aten::tanh", "aten::relu")
    # a user map pairs what it names and says so
    m = tmp_path / "map.json"
    m.write_text(json.dumps({"MLP/fc1:add": "2:aten::addmm"}))
    proc = run_cli("locate", traces["flax_mlp"], traces["torch_mlp"], "--map", m, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    d = json.loads(proc.stdout)
    user = [x for x in d["mapping"] if x["by"] == "user map"]
    assert len(user) == 1 and user[0]["a_name_stack"] == "MLP/fc1" and user[0]["b_name_stack"] == "2"


def test_bad_map_file(traces, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        proc = run_cli("locate", traces["flax"], traces["torch"], "--map", path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_map_inline_json_and_bounds(traces, tmp_path):
    """--map takes the JSON itself as well as a file (the same pairs); a FIFO is refused at
    once (it blocked the read forever), and so are a map of too many entries (50,000 ran
    more than 300 s) and an oversized file: one line, exit 2, before any trace is read."""
    entry = {"MLP/fc1:add": "2:aten::addmm"}
    m = tmp_path / "map.json"
    m.write_text(json.dumps(entry))
    by_file = run_cli("locate", traces["flax_mlp"], traces["torch_mlp"], "--map", m, "--json")
    inline = run_cli("locate", traces["flax_mlp"], traces["torch_mlp"], "--map",
                     json.dumps(entry), "--json")
    assert inline.returncode == by_file.returncode and inline.returncode in (0, 1), inline.stderr
    user = [x for x in json.loads(inline.stdout)["mapping"] if x["by"] == "user map"]
    assert [(x["a_name_stack"], x["b_name_stack"]) for x in user] == [("MLP/fc1", "2")]
    assert json.loads(inline.stdout)["mapping"] == json.loads(by_file.stdout)["mapping"]
    fifo = tmp_path / "map.fifo"
    os.mkfifo(fifo)
    many = tmp_path / "many.json"
    many.write_text(json.dumps({f"a{i}": f"b{i}" for i in range(50_000)}))
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"a": "b" * (2 << 20)}))
    cases = [(fifo, f"{fifo}: the map file is not a regular file (give a JSON file, or the "
                    f"JSON itself)"),
             (many, f"{many}: the map file has 50,000 entries, more than the 256 a map may "
                    f"hold (name modules, or use * patterns)"),
             (big, f"{big}: the map file is {big.stat().st_size:,} bytes, more than the 1 MiB "
                   f"a map may hold"),
             ('{"a": 1}', 'the --map JSON must be a JSON object of string to string '
                          '(e.g. {"MLP/fc1": "fc1"})'),
             ("{not json", "the --map JSON is not valid JSON (Expecting property name enclosed "
                           "in double quotes: line 1 column 2 (char 1))")]
    for command in ("locate", "explain", "report"):
        for spec, message in cases:
            # a missing trace b: the map is refused before any trace is looked at
            proc = run_cli(command, traces["flax_mlp"], tmp_path / "nowhere.h5", "--map", spec)
            assert proc.returncode == 2 and proc.stdout == "", (command, spec, proc.stdout)
            assert proc.stderr == f"tracediff: error: {message}\n", (command, spec)
