"""torch.compile recorded faithfully: real inductor and aot_eager compiles on CPU.

Every fixture run is recorded once for the module (plain runs next to them), with one
inductor cache under tmp shared by all of them, so each graph is compiled by inductor
once per session. fixtures/torch_compiled_block.py is the script throughout.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.helpers import FIXTURES, ROOT  # noqa: E402
import tracediff  # noqa: E402
from tracediff.diff.compare.levels import probe_pattern  # noqa: E402
from tracediff.trace import schema  # noqa: E402
from tracediff.trace.reader import Trace  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="inductor needs a C++ compiler on CPU")

SCRIPT = os.path.join(FIXTURES, "torch_compiled_block.py")
DRIVER = os.path.join(FIXTURES, "torch_compiled_runs.py")
FMA = {"cpp.enable_floating_point_contract_flag": "fast"}
PROBE = "^forward$"
MLP = ["--model", "mlp"]
INFER = ["--model", "mlp", "--infer", "--dropout", "0.5"]
AOT = ["--backend", "aot_eager", "--graph-break", "--batches", "4,6", "--steps", "3",
       "--compile-step"]
CLI_ARGS = INFER + ["--fallback-random"]
# one process recording its runs in turn (fixtures/torch_compiled_runs.py: one torch
# import and one warm-up of inductor for many compiled runs), next to a `tracediff record`
# of the smallest script: the command line path, where torch and Dynamo are imported
# after the recorder is installed, compared with the driver's plain run of the same
# arguments ("inf")
DRIVER_RUNS = [
    {"name": "mlp", "args": MLP, "plain": True},
    {"name": "mlp_eager", "args": MLP + ["--backend", "eager"]},
    {"name": "inf", "args": CLI_ARGS, "plain": True},
    {"name": "inf2", "args": CLI_ARGS},
    {"name": "inf_eager", "args": INFER + ["--backend", "eager"]},
    {"name": "inf_rng", "args": INFER},
    {"name": "blk", "args": ["--infer"], "probe": PROBE, "plain": True},
    {"name": "blk_fma", "args": ["--infer"], "probe": PROBE, "inductor": FMA},
    {"name": "blk_eager", "args": ["--infer", "--backend", "eager"]},
    {"name": "aot", "args": AOT, "plain": True},
]


def _env(folder):
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
    e["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    return e


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """({name: stdout} of every run, {name: trace path}); `NAME.plain` for plain runs."""
    folder = tmp_path_factory.mktemp("torch_compile")
    env = _env(folder)

    def start(name, *argv):   # output to files: a full pipe would stall a long run
        with open(folder / f"{name}.stdout", "w") as o, open(folder / f"{name}.stderr", "w") as e:
            return name, subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT, stdout=o,
                                          stderr=e)

    def finish(job):
        name, proc = job
        proc.wait(timeout=900)
        err = (folder / f"{name}.stderr").read_text()
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{err[-4000:]}"
        return (folder / f"{name}.stdout").read_text()

    # the command-line recording compiles its graph cold, alongside the driver
    cli = start("cli", "-m", "tracediff", "record", "-o", str(folder / "cli.h5"), SCRIPT, *CLI_ARGS)
    driver = start("driver", DRIVER, str(folder), json.dumps(DRIVER_RUNS))
    out = {"cli": finish(cli)}
    finish(driver)
    for run in DRIVER_RUNS:
        for suffix in ((".plain", "") if run.get("plain") else ("",)):
            out[run["name"] + suffix] = (folder / f"{run['name']}{suffix}.out").read_text()
    out["cli.plain"] = out["inf.plain"]   # the same script and arguments, not recorded
    names = [r["name"] for r in DRIVER_RUNS] + ["cli"]
    return out, {n: folder / f"{n}.h5" for n in names}


@pytest.fixture(scope="module")
def traces(runs):
    _, paths = runs
    opened = {k: Trace(p) for k, p in paths.items()}
    yield opened
    for t in opened.values():
        t.close()


def _events(t, kind=None, origin=None, op=None):
    out = []
    for i in range(len(t)):
        e = t.events[i]
        if (kind is None or int(e["kind"]) == kind) and (origin is None or int(e["origin"]) == origin) \
                and (op is None or t.string(e["op"]) == op):
            out.append(t.event(i))
    return out


def _line(text, nth=None):
    """`torch_compiled_block.py:N` of the fixture line containing `text` (the only one, or
    the nth)."""
    lines = open(SCRIPT).read().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if text in line]
    assert len(found) == 1 or nth is not None, found
    return f"torch_compiled_block.py:{found[nth or 0]}"


# -- 1. faithful ----------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["mlp", "aot", "blk", "cli"])
def test_recorded_compiled_run_prints_exactly_what_it_prints_unrecorded(runs, key):
    # mlp: inductor forward + backward; aot: aot_eager with a graph break, a recompilation
    # to a dynamic batch size and a compiled optimizer step; blk: inductor and --probe;
    # cli: `tracediff record` of a script that imports torch and compiles (random ops)
    out, _ = runs
    assert out[key] == out[f"{key}.plain"]
    assert out[key].strip()


def test_manifest_records_the_compile_configuration(traces):
    m = traces["inf"].manifest["frameworks"]["torch"]["compile"]
    assert m["torch_compile_calls"] == [{"backend": "inductor", "mode": None, "dynamic": None,
                                         "fullgraph": False, "options": {}}]
    assert m["settings"]["inductor"]["fallback_random"] is True
    assert traces["mlp"].manifest["frameworks"]["torch"]["compile"]["settings"]["inductor"][
        "fallback_random"] is False
    st = m["stats"]
    assert st["hooked"] and st["errors"] == [] and st["compiled_calls"] == 2 and st["replayed_ops"] > 0
    assert traces["aot"].manifest["frameworks"]["torch"]["compile"]["torch_compile_calls"][0][
        "backend"] == "aot_eager"
    assert traces["mlp_eager"].manifest["frameworks"]["torch"]["compile"]["torch_compile_calls"] == []


# -- 2. compiled calls and their replayed aten graphs ---------------------------------------
def test_forward_and_backward_graphs_are_calls_with_replayed_ops(traces):
    t = traces["mlp"]
    calls = _events(t, schema.KIND_CALL, schema.ORIGIN_COMPILED)
    assert [(c["op"], c["phase"], c["step"]) for c in calls] == [
        ("compiled:forward", "forward", 0), ("compiled:forward:backward", "backward", 0),
        ("compiled:forward", "forward", 1), ("compiled:forward:backward", "backward", 1)]
    fwd, bwd = calls[0], calls[1]
    assert bwd["parent"] == fwd["index"]      # the backward of that forward call
    line = _line("h = torch.relu(self.fc1(x))")
    eqns = [e for e in _events(t, schema.KIND_EQN) if e["call"] == fwd["index"]]
    assert all(e["origin"] == "replay" and e["parent"] == fwd["index"] for e in eqns)
    addmm = [e for e in eqns if e["op"] == "aten::addmm"]
    assert [(e["name_stack"], e["node"]) for e in addmm] == [("fc1", "aten::addmm"),
                                                             ("fc2", "aten::addmm")]
    assert addmm[0]["source"] == line
    assert addmm[1]["source"] == _line("return self.fc2(h)")
    # dataflow: fc1's addmm reads the bias parameter (an init op outside the graph), the
    # view of the batch and the transposed weight (replayed ops of the same call)
    ins = [(int(r["producer"]), int(r["producer_slot"])) for r in t.input_rows(addmm[0]["index"])]
    prods = [t.event(p) for p, _ in ins]
    assert [p["op"] for p in prods[1:]] == ["aten::view", "aten::permute"]
    assert all(p["call"] == fwd["index"] for p in prods[1:])
    assert prods[0]["call"] == -1 and prods[0]["kind"] in ("op", "input")
    # backward ops take the module and line of their forward op
    beqns = [e for e in _events(t, schema.KIND_EQN) if e["call"] == bwd["index"]]
    assert {e["phase"] for e in beqns} == {"backward"}
    mm = [e for e in beqns if e["op"] == "aten::mm"]
    assert {(e["name_stack"], e["source"]) for e in mm} >= {("fc1", line)}
    # the call's outputs are the real ones, named after the graph's nodes; the model's
    # output feeds the eager loss recorded as before
    names = [t.value_meta(r)["name"] for r in t.value_rows(fwd["index"])]
    assert names[0] == "view_3" and all(names)
    (pow_,) = [e for e in _events(t, schema.KIND_OP, op="aten::pow.Tensor_Scalar")
               if e["phase"] == "forward" and e["step"] == 0]
    assert [(int(r["producer"]), int(r["producer_slot"])) for r in t.input_rows(pow_["index"])] == \
        [(fwd["index"], 0)]
    assert len(_events(t, schema.KIND_OPTIM)) == 2


def test_aot_eager_replay_equals_the_compiled_graphs(traces):
    # aot_eager runs the same aten ops: replaying them must give the compiled outputs
    # bitwise, through graph breaks, the recompilation to a dynamic batch and the step
    t = traces["aot"]
    st = t.manifest["frameworks"]["torch"]["compile"]["stats"]
    assert st["errors"] == []
    fid = st["replay_vs_compiled"]
    assert fid["calls_compared"] == st["compiled_calls"] > 0
    assert fid["calls_where_replay_differs"] == 0
    ops = {e["op"] for e in _events(t, schema.KIND_CALL, schema.ORIGIN_COMPILED)}
    resume = [o for o in ops if o.startswith("compiled:torch_dynamo_resume_in_forward")]
    assert resume and "compiled:step" in ops and "compiled:forward:backward" in ops
    ids = {g["compile_id"] for g in st["graphs"] if g["op"] == "compiled:forward"}
    assert len(ids) == 2 and len({i.split("/")[0] for i in ids}) == 1   # frame N: N/0, N/1
    # batch 6 after batch 4: the recompiled graph takes the batch size as an input
    assert {len(_events(t, schema.KIND_OPTIM))} == {3}
    assert _events(t, schema.KIND_EQN, op="aten::native_layer_norm")


# -- 3. locate descends into a compiled call -------------------------------------------------
# Whether -ffp-contract=fast changes inductor's kernels depends on the CPU: the vector code
# inductor picks (AVX2 here fuses a multiply and an add; its AVX-512 code on some CPUs has
# nothing left to fuse). The premise, computed with plain torch.compile and no tracediff:
# do the block's outputs, and its layer norm's (the first op) compiled alone, change?
CONTRACT_PREMISE = r"""
import importlib.util, json, sys
import torch, torch._dynamo
import torch._inductor.config as inductor_config
spec = importlib.util.spec_from_file_location("torch_compiled_block", sys.argv[1])
block = importlib.util.module_from_spec(spec)
spec.loader.exec_module(block)
torch.manual_seed(0)
model = block.Block()
x = torch.randn(4, 8, 16)
out = {}
for flag in ("off", "fast"):
    torch._dynamo.reset()
    with inductor_config.patch({"cpp.enable_floating_point_contract_flag": flag}), torch.no_grad():
        out[flag] = (torch.compile(model)(x), torch.compile(model.ln)(x))
print(json.dumps({"block": not torch.equal(out["off"][0], out["fast"][0]),
                  "ln": not torch.equal(out["off"][1], out["fast"][1])}))
"""


@pytest.fixture(scope="module")
def contract_changes(runs):
    """{"block": bool, "ln": bool}: whether fp-contract=fast changes the compiled block's
    outputs and its compiled layer norm's on this CPU (inductor's cache of `runs`)."""
    env = _env(runs[1]["blk"].parent)
    p = subprocess.run([sys.executable, "-c", CONTRACT_PREMISE, SCRIPT], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_contract_flag_is_an_environment_difference_and_the_probe_runs(traces):
    # on every CPU: the flag is named, and the probe ran on both calls without error
    r = tracediff.locate(traces["blk"], traces["blk_fma"])
    keys = {e["key"]: (e["a"], e["b"]) for e in r.env_diff}
    assert keys["frameworks.torch.compile.settings.inductor.cpp.enable_floating_point_contract_flag"] \
        == ("off", "fast")
    st = traces["blk"].manifest["frameworks"]["torch"]["compile"]["stats"]["probe"]
    assert st["calls"] == 2 and st["errors"] == [] and st["final_outputs_differ_from_compiled"] == 0


def test_compiler_level_difference_is_narrowed_by_the_probe(traces, contract_changes):
    r = tracediff.locate(traces["blk"], traces["blk_fma"])
    f = r.first_difference
    if not contract_changes["block"]:
        # the flag changes no value here: no difference may be reported
        assert f is None and r.verdict == "match", f
        pytest.skip("fp-contract=fast changes no compiled value on this CPU")
    if not contract_changes["ln"]:
        pytest.skip("fp-contract=fast leaves the compiled layer norm unchanged on this CPU")
    # fp-contract=fast lets the C++ compiler fuse multiply-adds in inductor's kernels:
    # every replayed op matches, the compiled outputs differ, the probe names the op
    assert f is not None and f.origin == "probe" and f.inputs_match is True
    assert f.call["op"] == "compiled:forward" and f.call.get("probe_a") is not None
    assert f.a["name_stack"] == "ln" and f.a["source"] == _line("h = self.ln(x)")
    assert f.a["node"] == "aten::native_layer_norm"
    assert f.metrics["max_ulp"] > 0


def test_probe_pattern_of_a_compiled_call():
    assert probe_pattern("compiled:forward") == "^forward$"
    assert probe_pattern("compiled:forward:backward") == "^forward$"


# -- 4. eager against compiled ----------------------------------------------------------------
def test_eager_vs_compiled_names_the_reduction_inductor_computes_differently(traces):
    r = tracediff.locate(traces["mlp_eager"], traces["mlp"])
    f = r.first_difference
    # fc2's bias gradient: inductor's fused sum over the batch rounds differently
    assert f.a["op"] == "aten::sum.dim_IntList" and f.a["phase"] == "backward"
    assert f.a["name_stack"] == "fc2" and f.a["source"] == _line("return self.fc2(h)")
    assert f.inputs_match is True and f.origin == "compiled" and f.pair_by == "decomposition"
    assert f.b["kind"] == "eqn" and f.b["origin"] == "replay"
    assert 0 < f.metrics["max_ulp"] < 100
    (v,) = f.values
    assert v["compared"] and not v["metrics"]["bitwise_equal"]
    assert any(e["key"] == "frameworks.torch.compile" for e in r.env_diff)


def test_eager_vs_compiled_decomposed_layer_norm_with_probe_values(traces):
    r = tracediff.locate(traces["blk_eager"], traces["blk"])
    f = r.first_difference
    assert f.a["op"] == "aten::native_layer_norm" and f.a["name_stack"] == "ln"
    assert f.a["source"] == _line("h = self.ln(x)")
    assert f.inputs_match is True and f.origin == "probe"
    assert "aten::native_layer_norm is 7 op(s)" in f.note and "var_mean" in f.note
    (v,) = f.values   # the output; mean and rstd stay inside the compiled inference graph
    assert v["b"]["name"] == "add_1" and not v["metrics"]["bitwise_equal"]
    # the same, oriented the other way
    g = tracediff.locate(traces["blk"], traces["blk_eager"]).first_difference
    assert g.b["op"] == "aten::native_layer_norm" and g.a["node"] == "aten::native_layer_norm"


def test_random_ops_match_eager_with_fallback_random_and_differ_without(traces):
    r = tracediff.locate(traces["inf_eager"], traces["inf"])
    assert r.verdict == "match" and r.exit_code == 0 and r.first_difference is None
    assert r.alignment["only_in_a"] == 0 and r.alignment["only_in_b"] == 0
    r = tracediff.locate(traces["inf_eager"], traces["inf_rng"])
    f = r.first_difference
    assert r.verdict == "diverged"
    assert f.a["name_stack"] == "drop" and f.a["source"] == _line("h = self.drop(h)", nth=0)
    assert f.inputs_match is True and "native_dropout" in f.note


def test_two_identical_compiled_runs_match(traces):
    r = tracediff.locate(traces["inf"], traces["inf2"])
    assert r.verdict == "match" and r.first_difference is None
    assert r.alignment["only_in_a"] == r.alignment["only_in_b"] == 0


def test_cli_locate_eager_vs_compiled(runs):
    from click.testing import CliRunner

    from tracediff.cli import main

    _, paths = runs
    res = CliRunner().invoke(main, ["locate", str(paths["blk_eager"]), str(paths["blk"])])
    assert res.exit_code in (0, 1), res.output
    first = [line for line in res.output.splitlines() if line.startswith("first bitwise")]
    assert first and "aten::native_layer_norm" in first[0] and "probe" in first[0]
    assert "introduced here" in first[0]


# -- settings tracediff cannot format -------------------------------------------------------
UNFORMATTABLE_OPTION = """\
import torch


class Threshold(int):
    def __repr__(self):
        raise RuntimeError("Threshold has no repr")

    __str__ = __repr__


def f(x):
    return torch.sin(x) * 2


g = torch.compile(f, options={"realize_reads_threshold": Threshold(4)})   # compiled lazily
print(float((torch.ones(3) * 2).sum()))
"""


def test_a_compile_option_whose_repr_raises_never_fails_the_scripts_compile_call(tmp_path):
    """Issue 66: `record` notes each `torch.compile` call's settings from inside the call;
    an option whose repr raises (an int subclass inductor accepts) raised out of the
    script's `torch.compile(...)`: the recorded script died where the plain one runs on.
    A plain type's subclass is now shown by its base type's repr, anything else by its
    type (counted in `skipped_settings`)."""
    from tests.helpers import run_cli, run_plain

    script = tmp_path / "option.py"
    script.write_text(UNFORMATTABLE_OPTION)
    out = tmp_path / "option.h5"
    proc = run_cli("record", "-o", out, script, cwd=tmp_path)
    plain = run_plain(str(script), cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, plain.stdout), proc.stderr
    with Trace(str(out)) as t:
        m = t.manifest["frameworks"]["torch"]
        assert "recording_error" not in m
        assert m["compile"]["torch_compile_calls"] == [
            {"backend": "inductor", "mode": None, "dynamic": None, "fullgraph": False,
             "options": {"realize_reads_threshold": "4"}}]
