"""PyTorch capture: real torch, real HDF5 traces recorded by the CLI in subprocesses."""

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.conftest import BROKEN_DOT, MKL_SSE, TORCH_GRU_STEPS as GRU_STEPS  # noqa: E402
from tests.helpers import FIXTURES, require_loopback, run_plain  # noqa: E402
from tracediff.trace import schema  # noqa: E402
from tracediff.trace.reader import Trace  # noqa: E402



def _record(recorded, script, *args, env=None):
    """A session-shared recording (tests/helpers.Recordings): (path, CompletedProcess)."""
    out = recorded(script, *args, env=env)
    return out, recorded.proc(out)


def _ops(trace, op=None, kind=schema.KIND_OP):
    """Event dicts of the given kind (and op name) in order."""
    out = []
    for i in range(len(trace)):
        e = trace.events[i]
        if int(e["kind"]) == kind and (op is None or trace.string(e["op"]) == op):
            out.append(trace.event(i))
    return out


def _out(trace, eid, slot=0):
    rows = trace.value_rows(eid, role=schema.ROLE_OUT)
    row = rows[rows["slot"] == slot][0]
    return row, trace.read_value(row)


def _inputs(trace, eid):
    return [(int(r["producer"]), int(r["producer_slot"])) for r in trace.input_rows(eid)]


@pytest.fixture(scope="module")
def dot(recorded):
    out, proc = _record(recorded, "torch_dot.py")
    with Trace(out) as t:
        yield t, proc


@pytest.fixture(scope="module")
def broken_dot(recorded):
    out, proc = _record(recorded, "torch_dot.py", env=BROKEN_DOT)
    with Trace(out) as t:
        yield t, proc


@pytest.fixture(scope="module")
def gru(recorded):
    out, proc = _record(recorded, "torch_gru_adam.py", "--steps", GRU_STEPS)
    with Trace(out) as t:
        yield t, proc


# -- the dot case -------------------------------------------------------------------------
def test_dot_forward_op_links_both_inputs_to_arange(dot):
    t, proc = dot
    assert proc.stdout.splitlines()[0] == "28.0"
    (arange,) = _ops(t, "aten::arange")
    (fwd,) = [e for e in _ops(t, "aten::dot") if e["phase"] == "forward"]
    assert fwd["framework"] == "torch" and fwd["origin"] == "eager"
    assert _inputs(t, fwd["index"]) == [(arange["index"], 0), (arange["index"], 0)]
    assert _out(t, fwd["index"])[1] == np.float32(14.0)
    assert _out(t, arange["index"])[1].tolist() == [0.0, 1.0, 2.0, 3.0]
    # the source line of the dot is the fixture's `y = 2 * torch.dot(x, x)` line
    lines = open(os.path.join(FIXTURES, "torch_dot.py")).read().splitlines()
    file, line = fwd["source"].rsplit(":", 1)
    assert file == "torch_dot.py" and "torch.dot(x, x)" in lines[int(line) - 1]


def test_dot_backward_ops_link_to_forward_dot(dot):
    t, _ = dot
    (fwd,) = _ops(t, "aten::dot")
    bwd = [e for e in _ops(t) if e["node"] == "DotBackward0"]
    assert len(bwd) >= 2
    for e in bwd:
        assert e["phase"] == "backward"
        assert e["parent"] == fwd["index"]
        assert e["source"] == fwd["source"]
    acc = [e for e in _ops(t) if e["node"] == "AccumulateGrad"]
    assert len(acc) == 1
    # the gradient accumulated into x is 4x, computed by the DotBackward0 ops
    (prod,) = _inputs(t, acc[0]["index"])
    assert t.event(prod[0])["node"] == "DotBackward0"
    assert _out(t, acc[0]["index"])[1].tolist() == [0.0, 4.0, 8.0, 12.0]
    # y.item(): the scalar is recorded as such
    (item,) = _ops(t, "aten::_local_scalar_dense")
    row, val = _out(t, item["index"])
    assert row["flags"] & schema.VFLAG_SCALAR and float(val) == 28.0


def test_dot_manifest(dot):
    t, _ = dot
    m = t.manifest["frameworks"]["torch"]
    assert m["version"] == torch.__version__
    assert m["mode"] == "eager dispatch"
    assert m["threads_captured"] is False
    for key in ("config", "parallel_info", "cpu_capability", "num_threads", "num_interop_threads",
                "deterministic_algorithms", "cuda_matmul_allow_tf32", "cudnn_allow_tf32",
                "float32_matmul_precision", "compile"):
        assert key in m
    assert t.manifest["end"]["status"] == "completed"


def test_broken_dot_records_zero_with_identical_inputs(dot, broken_dot):
    good, _ = dot
    bad, proc = broken_dot
    # sitecustomize imported torch before tracediff: the capture installed at once
    assert proc.stdout.splitlines()[0] == "0.0"
    (g,) = _ops(good, "aten::dot")
    (b,) = _ops(bad, "aten::dot")
    g_in = [good.read_value(good.value_rows(p)[0]) for p, _ in _inputs(good, g["index"])]
    b_in = [bad.read_value(bad.value_rows(p)[0]) for p, _ in _inputs(bad, b["index"])]
    for x, y in zip(g_in, b_in, strict=True):
        assert x.tobytes() == y.tobytes()
    assert _out(good, g["index"])[1] == np.float32(14.0)
    assert _out(bad, b["index"])[1] == np.float32(0.0)


def test_an_input_links_to_the_output_slot_that_produced_it(recorded):
    """max(dim) returns (values, indices): the op reading the indices links to slot 1,
    the one reading the values to slot 0 (truth: torch.max run here)."""
    out, proc = _record(recorded, "torch_max_dim.py")
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    values, indices = torch.max(x, dim=1)
    with Trace(out) as t:
        (mx,) = [e["index"] for e in _ops(t, "aten::max.dim")]
        assert np.array_equal(_out(t, mx, 0)[1], values.numpy())
        assert np.array_equal(_out(t, mx, 1)[1], indices.numpy())
        (unsqueeze,) = [e["index"] for e in _ops(t, "aten::unsqueeze")]   # indices[:, None]
        assert _inputs(t, unsqueeze) == [(mx, 1)]
        assert np.array_equal(_out(t, unsqueeze)[1], indices[:, None].numpy())
        first_sum = _ops(t, "aten::sum")[0]["index"]                      # values.sum()
        assert _inputs(t, first_sum) == [(mx, 0)]
        (gather,) = [e["index"] for e in _ops(t, "aten::gather")]
        (randn,) = [e["index"] for e in _ops(t, "aten::randn")]
        assert _inputs(t, gather) == [(randn, 0), (unsqueeze, 0)]


def test_a_parameter_written_through_data_links_to_that_write(recorded):
    """`p.data.normal_()` shares p's storage but not its version counter: the op that then
    reads p must see the new values (linked to the write), not the constructor's (the
    recorder kept the stale producer; HF models initialise their weights this way)."""
    out, proc = _record(recorded, "torch_data_init.py")
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.data.normal_(mean=0.0, std=0.5)
        lin.bias.data.fill_(0.25)
    with Trace(out) as t:
        (addmm,) = [e["index"] for e in _ops(t, "aten::addmm")]
        (normal,) = [e["index"] for e in _ops(t, "aten::normal_")]
        (fill,) = [e["index"] for e in _ops(t, "aten::fill_.Scalar")]
        rows = t.input_rows(addmm)
        bias, weight_t = rows[0], rows[2]
        assert np.array_equal(t.read_value(t.value_rows(int(bias["producer"]),
                                                        role=schema.ROLE_OUT)[0]),
                              lin.bias.detach().numpy())
        # linked to the write itself (whose output covers the whole parameter): no snapshot
        assert int(bias["producer"]) == fill
        # the weight reaches addmm through aten::t: its producer reads normal_'s values
        (tr,) = [e["index"] for e in _ops(t, "aten::t")]
        assert int(weight_t["producer"]) == tr
        (w_in,) = t.input_rows(tr)
        pw = int(w_in["producer"])
        assert pw == normal
        assert np.array_equal(t.read_value(t.value_rows(pw, role=schema.ROLE_OUT)[0]),
                              lin.weight.detach().numpy())



def test_an_op_reading_an_in_place_result_links_to_the_write(tmp_path):
    """An op that writes its argument returns an alias of it, and autograd bumps the
    version counter only after the recorder has seen the op: the version is read at the
    next op, so what reads the written tensor, after a view of it was taken too, links to
    the write with no snapshot (read at once, the version looked moved, and the view,
    the storage's last writer, does not cover the tensor: it was snapshot)."""
    import tracediff

    path = tmp_path / "inplace.h5"
    with tracediff.record(str(path), frameworks=("torch",)):
        x = torch.zeros(3, 4)
        x.add_(1.0)
        y = x.t()
        z = x * 2.0
        w = torch.ones(4, 3, requires_grad=True) * 2
        v = w.t()
        v.add_(1.0)
        u = w * v.t()
    with Trace(path) as t:
        assert _ops(t, kind=schema.KIND_INPUT) == []      # every value has its producer
        add, v_add = (e["index"] for e in _ops(t, "aten::add_.Tensor"))
        x_t, w_t, v_t = (e["index"] for e in _ops(t, "aten::t"))
        x_mul, w_mul, u_mul = (e["index"] for e in _ops(t, "aten::mul.Tensor"))
        assert _inputs(t, x_t) == [(add, 0)] and _inputs(t, x_mul) == [(add, 0)]
        assert np.array_equal(_out(t, x_t)[1], y.numpy())
        assert np.array_equal(_out(t, x_mul)[1], z.numpy())
        assert _inputs(t, v_add) == [(w_t, 0)] and _inputs(t, v_t) == [(v_add, 0)]
        assert _inputs(t, u_mul) == [(v_t, 0), (v_t, 0)]   # w, written through v, is v.t()
        assert np.array_equal(_out(t, u_mul)[1], u.detach().numpy())


def test_an_empty_tensor_links_to_its_producer_whatever_object_held_its_id_before(tmp_path):
    """An empty tensor has no storage. Where storages may be freed (FSDP imported, as HF
    transformers does), the recorder checks that a known tensor's storage is still the
    one its producer wrote; an empty output left that check the storage of the last
    object that had the same id. So, as the allocator reused addresses, a BatchNorm's
    empty `save_mean` was its producer's or an `<input>` snapshot from run to run (HF
    ResNet: 106-120 of 130 torch units paired between identical runs; now 122 each).
    FSDP imported and a process group up is what makes the recorder watch for it."""
    require_loopback()   # gloo's one-rank group still resolves 127.0.0.1
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401

    import tracediff

    path = tmp_path / "empty.h5"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with tracediff.record(str(path), frameworks=("torch",)):
            lin = torch.nn.Linear(4, 4)
            x = torch.randn(2, 4)
            lin(x)
            for _ in range(20):
                a = x * 2.0          # an output with a storage, at some address...
                del a
                e = torch.empty(0)   # ... that the next tensor object may get
                e + 1.0
    finally:
        dist.destroy_process_group()
    with Trace(path) as t:
        empties = [e["index"] for e in _ops(t, "aten::empty.memory_format")][-20:]  # not
        adds = [e["index"] for e in _ops(t, "aten::add.Tensor")]                  # Linear's
        assert len(adds) == 20
        assert [_inputs(t, a)[0] for a in adds] == [(e, 0) for e in empties]


# -- GRU + Adam ---------------------------------------------------------------------------
def test_gru_recording_leaves_output_bitwise_identical(gru, recorded):
    _, proc = gru
    plain = recorded.plain("torch_gru_adam.py", "--steps", GRU_STEPS)
    assert proc.stdout == plain.stdout


def test_gru_module_paths_and_backward_inheritance(gru):
    t, _ = gru
    ops = _ops(t)
    fwd_addmm = [e for e in ops if e["op"] == "aten::addmm" and e["phase"] == "forward"]
    assert {e["name_stack"] for e in fwd_addmm} == {"rnn.gru", "head"}
    by_id = {e["index"]: e for e in ops}
    bwd = [e for e in ops if e["phase"] == "backward" and e["node"] != "AccumulateGrad"]
    assert bwd
    for e in bwd:
        assert e["parent"] in by_id, e
        fwd = by_id[e["parent"]]
        assert fwd["phase"] == "forward"
        assert (e["name_stack"], e["source"]) == (fwd["name_stack"], fwd["source"])
    assert {e["name_stack"] for e in bwd if e["node"] == "AddmmBackward0"} == {"rnn.gru", "head"}
    acc = [e for e in ops if e["node"] == "AccumulateGrad"]
    assert {e["params"].split(",")[0] for e in acc} == {
        "param=" + n for n in ("rnn.gru.weight_ih", "rnn.gru.weight_hh", "rnn.gru.bias_ih",
                               "rnn.gru.bias_hh", "head.weight", "head.bias")}
    # optimizer ops are in the optimizer phase, and steps count up
    assert any(e["phase"] == "optimizer" and e["op"] == "aten::addcdiv_" for e in ops)
    assert sorted({e["step"] for e in ops}) == list(range(int(GRU_STEPS) + 1))


def _load_fixture(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(FIXTURES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gru_optimizer_snapshots_equal_script_state(gru):
    t, _ = gru
    expected = []

    def on_step(step, model, opt):
        snap = {}
        for n, p in model.named_parameters():
            snap[f"params/{n}"] = p.detach().numpy().copy()
            snap[f"grads/{n}"] = p.grad.numpy().copy()
            for k, v in opt.state[p].items():
                snap[f"state/{n}/{k}"] = v.numpy().copy()
        expected.append(snap)

    _load_fixture("torch_gru_adam").train(int(GRU_STEPS), on_step=on_step)
    snaps = _ops(t, kind=schema.KIND_OPTIM)
    assert len(snaps) == int(GRU_STEPS)
    for step, (e, exp) in enumerate(zip(snaps, expected)):
        assert e["op"] == "optim:Adam" and e["phase"] == "optimizer" and e["step"] == step
        assert e["origin"] == "snapshot"
        got = {}
        for row in t.value_rows(e["index"]):
            got[t.value_meta(row)["name"]] = t.read_value(row)
        assert set(got) == set(exp)
        assert {k.rsplit("/", 1)[1] for k in got if k.startswith("state/")} == {
            "step", "exp_avg", "exp_avg_sq"}
        for k, v in exp.items():
            assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k


def test_gru_every_input_has_a_producer_with_a_value(gru):
    t, _ = gru
    ins = t.inputs
    assert len(ins) and (ins["producer"] >= 0).all()
    assert (ins["producer"] < ins["event"]).all()
    kinds = t.events["kind"][ins["producer"]]
    assert set(np.unique(kinds)) <= {schema.KIND_OP, schema.KIND_INPUT}
    # the first addmm of step 0 reads the gru bias produced by its uniform_ init
    first = next(e for e in _ops(t, "aten::addmm") if e["name_stack"] == "rnn.gru")
    producers = [t.event(p)["op"] for p, _ in _inputs(t, first["index"])]
    assert producers[0] == "aten::uniform_"


# -- MKL instruction set ------------------------------------------------------------------
@pytest.fixture(scope="module")
def gru_sse(recorded):
    out, proc = _record(recorded, "torch_gru_adam.py", "--steps", GRU_STEPS, env=MKL_SSE)
    with Trace(out) as t:
        yield t, proc


def test_mkl_compatible_path_changes_a_blas_output_bitwise(gru, gru_sse):
    """MKL's reproducible code path (`MKL_CBWR=COMPATIBLE`: SSE2 kernels) rounds the GRU's
    addmm differently from the kernels it picks for this CPU (checked on AMD AVX2 and Intel
    AVX-512; `MKL_ENABLE_INSTRUCTIONS=SSE4_2` changes nothing on AMD, where MKL ignores it)."""
    a, _ = gru
    b, _ = gru_sse
    assert b.manifest["env"].get("MKL_CBWR") == "COMPATIBLE"
    assert len(a) == len(b)
    assert [a.string(x) for x in a.events["op"]] == [b.string(x) for x in b.events["op"]]
    first = None
    for i in range(len(a)):
        ha = a.value_rows(i)["hash"].tolist()
        hb = b.value_rows(i)["hash"].tolist()
        if ha != hb:
            first = i
            break
    assert first is not None, "MKL_CBWR=COMPATIBLE changed no recorded value"
    e = a.event(first)
    assert e["op"] in ("aten::addmm", "aten::mm"), e
    # its inputs are bitwise identical: this op is where the runs diverge
    for (pa, sa), (pb, sb) in zip(_inputs(a, first), _inputs(b, first), strict=True):
        assert _out(a, pa, sa)[0]["hash"] == _out(b, pb, sb)[0]["hash"]


# -- dtypes, empty, DataLoader ------------------------------------------------------------
@pytest.fixture(scope="module")
def dtypes(recorded):
    out, proc = _record(recorded, "torch_dtypes.py")
    with Trace(out) as t:
        yield t, proc


def test_bf16_and_complex_round_trip_exactly(dtypes):
    t, _ = dtypes
    torch.manual_seed(0)
    a = torch.randn(5, dtype=torch.float32)
    b = a.to(torch.bfloat16) * 3
    c = torch.complex(a, a.flip(0))
    d = c.conj() * 2
    (mul_bf16,) = [e for e in _ops(t, "aten::mul.Tensor")
                   if t.value_meta(t.value_rows(e["index"])[0])["dtype"] == "bfloat16"]
    row, v = _out(t, mul_bf16["index"])
    assert t.value_meta(row)["dtype"] == "bfloat16"
    assert np.asarray(v).view(np.int16).tobytes() == b.view(torch.int16).numpy().tobytes()
    (conj,) = _ops(t, "aten::_conj")
    assert _out(t, conj["index"])[1].tobytes() == c.conj().resolve_conj().numpy().tobytes()
    cmul = [e for e in _ops(t, "aten::mul.Tensor")
            if t.value_meta(t.value_rows(e["index"])[0])["dtype"] == "complex64"]
    assert _out(t, cmul[-1]["index"])[1].tobytes() == d.resolve_conj().numpy().tobytes()


def test_empty_outputs_are_flagged_uninitialised(dtypes):
    t, _ = dtypes
    (empty,) = _ops(t, "aten::empty.memory_format")
    row, v = _out(t, empty["index"])
    assert v is None
    assert row["flags"] & schema.VFLAG_UNINIT
    assert t.value_meta(row)["shape"] == [3, 4]
    (fill,) = _ops(t, "aten::fill_.Scalar")
    assert _inputs(t, fill["index"]) == [(empty["index"], 0)]
    assert (_out(t, fill["index"])[1] == 1.5).all()


def test_forked_dataloader_workers_do_not_write(recorded):
    out, proc = _record(recorded, "torch_dataloader.py")
    assert proc.stdout == run_plain("torch_dataloader.py").stdout
    with Trace(out) as t:
        assert t.complete and t.manifest["end"]["status"] == "completed"
        names = {t.string(x) for x in t.events["op"]}
        # the workers' own ops (full, sin, stack) never reach the parent's trace
        assert not names & {"aten::sin", "aten::full", "aten::stack", "aten::stack.out"}
        assert len(_ops(t, "aten::addmm")) == 4
        assert (t.inputs["producer"] >= 0).all()
        # batches rebuilt from shared memory are attributed to the script's loop line,
        # not to multiprocessing internals
        assert {e["source"].split(":")[0] for e in _ops(t)} == {"torch_dataloader.py"}


def test_a_recorder_failure_never_reaches_the_script(tmp_path, monkeypatch):
    """In-process: a bug in the recorder stops recording; the op still runs correctly."""
    from tracediff.capture import RecordOptions, Session
    from tracediff.capture.torch.recorder import TorchCapture
    from tracediff.trace.writer import TraceWriter

    writer = TraceWriter(tmp_path / "fail.h5", {})
    cap = TorchCapture()
    cap.install(Session(writer, RecordOptions()))
    try:
        x = torch.arange(4.0)
        assert torch.dot(x, x).item() == 14.0
        # a step every recorded op takes after running (an op whose arguments are all
        # tensors has no parameter summary to look up, so that is not one)
        monkeypatch.setattr(cap.writer, "add_event_ids", lambda *a: 1 / 0)
        assert torch.dot(x, x).item() == 14.0
        assert (x + 1).tolist() == [1.0, 2.0, 3.0, 4.0]
    finally:
        cap.uninstall()
    manifest = cap.manifest()
    writer.close()
    assert manifest["recording_error"].startswith("ZeroDivisionError")
    with Trace(tmp_path / "fail.h5") as t:
        assert len(_ops(t, "aten::dot")) == 1


def test_a_wrapper_subclass_never_stops_capture(recorded):
    """Issue #36: a tensor subclass whose bytes `.numpy()` refuses stopped the whole
    capture ("not supported for tensor subclasses"). Its values are now metadata only,
    counted in the manifest and warned about by `record` and `info`; every op after it
    is still recorded."""
    from tests.helpers import run_cli

    path, proc = _record(recorded, "torch_wrapper_subclass.py")
    assert "16.0 6.0" in proc.stdout
    assert "3 torch values of tensor subclasses (Wrap) recorded without their bytes" in \
        proc.stderr
    with Trace(path) as t:
        fw = t.manifest["frameworks"]["torch"]
        assert "recording_error" not in fw, fw.get("recording_error")
        assert fw["subclasses"]["unreadable_values"] == 3
        assert fw["subclasses"]["unreadable_types"] == {"Wrap": 3}
        ones = _ops(t, "aten::ones")
        assert len(ones) == 1     # the op after the subclass's ops was recorded
        mul = [e for e in _ops(t, "aten::mul.Tensor") if e["index"] > ones[0]["index"]]
        assert mul and _out(t, mul[0]["index"])[1].tolist() == [2.0, 2.0, 2.0]
        unread = [r for r in t.values if r["flags"] & schema.VFLAG_NOT_STORED]
        assert len(unread) == 3 and all(t.string(r["shape"]) == "4" for r in unread)
    out = run_cli("info", str(path), env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "capture: 3 torch values of tensor subclasses (Wrap)" in out.stdout


def test_module_keys_torch_cannot_name_never_reach_the_script(recorded):
    """Issue 66: module and parameter keys that are not str (`m._modules[0] = block`,
    a key object of the program's, `_parameters[1]`) run plainly, but torch's own
    `named_modules` cannot join them: the recorder's module hook raised that TypeError
    into the script's forward (the recorded script died), and the optimizer snapshot's
    stopped the capture. A module whose == raises failed the hook's lookup the same way.
    Now an int key is named as torch would ("0"), a key with no text by its type
    (`<Key>`, counted and named in the manifest), and every op and step is recorded."""
    out, proc = _record(recorded, "torch_unformattable.py", "names")
    assert proc.returncode == 0 and \
        proc.stdout == run_plain("torch_unformattable.py", "names").stdout, proc.stderr
    assert "Traceback" not in proc.stderr and "capture stopped" not in proc.stderr.lower()
    with Trace(out) as t:
        m = t.manifest["frameworks"]["torch"]
        assert "recording_error" not in m, m["recording_error"]
        assert m["skipped_names"]["first"] == ["key <Key>", "module <Unnamable>: RuntimeError"]
        stacks = {e["name_stack"] for e in _ops(t, "aten::addmm")}
        assert stacks == {"0.lin", "<Key>.lin"}
        steps = _ops(t, kind=schema.KIND_OPTIM)
        assert len(steps) == 3
        names = [t.string(r["name"]) for r in t.value_rows(steps[-1]["index"], schema.ROLE_OUT)]
        assert [n for n in names if n.startswith("params/")] == [
            "params/1", "params/0.lin.weight", "params/0.lin.bias", "params/<Key>.lin.weight",
            "params/<Key>.lin.bias"]


@pytest.mark.parametrize("level", ["full", "stats"])
def test_hash_words64_applies_to_torch_values(recorded, dtypes, level):
    """`record --hash words64` hashes torch values with words64 too (the docs say
    anywhere): the trace names it, every stored value's hash is the words64 of its bytes,
    and the run compares with its xxh3_64 recording as the same run."""
    from tests.helpers import locate_json
    from tracediff.trace import values

    out = recorded("torch_dtypes.py", options=("--level", level, "--hash", "words64"))
    with Trace(out) as t:
        assert t.manifest["recording"]["hash"] == "words64"
        full = dtypes[0]
        checked = 0
        for r, rf in zip(t.values, full.values):
            raw = full.read_value(rf)
            if raw is None or not int(r["hash"]):
                continue
            stored = np.ascontiguousarray(raw).view(full.string(rf["storage"]))
            assert int(r["hash"]) == values.words_digest(stored.tobytes())
            checked += 1
        assert checked > 10
    assert locate_json(out, dtypes[0].path)["verdict"] == "match"
