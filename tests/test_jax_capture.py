"""JAX capture on real jax/flax/optax: what a trace holds, and that recording changes nothing."""

import json

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.trace import schema

from .helpers import record, run_cli

GRU = "jax_gru_expm_adam.py"
FLOW = "jax_control_flow.py"
from .conftest import GRU_STEPS as STEPS


@pytest.fixture(scope="module")
def gru(jax_gru):
    return jax_gru["a"]


@pytest.fixture(scope="module")
def flow(recorded):
    opaque, stepped = recorded(FLOW), recorded(FLOW, options=("--loops", "stepped"))
    return recorded.proc(opaque), opaque, recorded.proc(stepped), stepped


def events(trace):
    return [trace.event(i) for i in range(len(trace))]


def ancestors(evs, e):
    found = set()
    while e["parent"] >= 0 and e["parent"] != e["call"]:
        found.add(e["parent"])
        e = evs[e["parent"]]
    return found


def test_recording_leaves_printed_result_bitwise_unchanged(gru, recorded):
    _, proc = gru
    plain = recorded.plain(GRU, "--steps", STEPS)
    assert "final loss:" in plain.stdout
    assert proc.stdout == plain.stdout


def test_calls_equations_and_links(gru):
    path, _ = gru
    t = tracediff.load(path)
    evs = events(t)
    calls = [e for e in evs if e["kind"] == "call"]
    steps = [e for e in calls if e["op"] == "jit:train_step"]
    assert len(steps) == int(STEPS)
    for call in steps:
        assert call["origin"] == "compiled" and call["source"] == "jax_gru_expm_adam.py:60"
        inner = [e for e in evs if e["call"] == call["index"]]
        assert len(inner) > 300 and all(e["index"] > call["index"] for e in inner)
        assert {e["origin"] for e in inner} == {"replay"}
        ops = {e["op"] for e in inner}
        assert {"dot_general", "tanh", "logistic", "custom_linear_solve"} <= ops
        stacks = {e["name_stack"] for e in inner}
        assert any("GRUCell_0" in s and s.startswith("jvp(") for s in stacks)
        assert any(s.startswith("transpose(jvp(") for s in stacks)
        # the call's inputs carry their pytree names, its outputs the compiled results
        names = [t.value_meta(r)["name"] for r in t.value_rows(call["index"], schema.ROLE_IN)]
        assert any("GRUCell_0" in (n or "") for n in names)
        assert len(t.value_rows(call["index"], schema.ROLE_OUT)) > 0
    # dataflow: each step's parameters come from the previous step's compiled outputs
    for prev, call in zip(steps, steps[1:]):
        producers = {int(r["producer"]) for r in t.input_rows(call["index"])}
        assert prev["index"] in producers
    # every input link points at an earlier event or is a literal
    ins = t.inputs
    assert np.all((ins["producer"] == schema.PRODUCER_LITERAL) | (ins["producer"] < ins["event"]))
    assert not np.any(ins["producer"] == schema.PRODUCER_UNKNOWN)


def test_user_source_lines_and_module_paths(gru):
    t = tracediff.load(gru[0])
    tanh = [e for e in events(t) if e["op"] == "tanh"]
    assert tanh and all(e["source"] == "jax_gru_expm_adam.py:25" for e in tanh)
    assert all("GRUCell_0" in e["name_stack"] for e in tanh)
    dense = [e for e in events(t) if e["op"] == "dot_general" and "Dense_0" in e["name_stack"]]
    assert dense and dense[0]["source"] == "jax_gru_expm_adam.py:26"


def test_optax_steps_are_named_snapshots(gru):
    t = tracediff.load(gru[0])
    steps = [e for e in events(t) if e["kind"] == "optim"]
    assert [e["step"] for e in steps] == list(range(int(STEPS)))
    for k, e in enumerate(steps):
        vals = {t.value_meta(r)["name"]: t.read_value(r) for r in t.value_rows(e["index"])}
        assert int(vals["state/count"]) == k + 1
        for prefix in ("grads", "params", "updates", "state/mu", "state/nu"):
            assert f"{prefix}/GRUCell_0/ir/kernel" in vals
        if k == 0:  # Adam's first moment after one step is (1 - b1) * grads
            np.testing.assert_allclose(vals["state/mu/Dense_0/bias"], 0.1 * vals["grads/Dense_0/bias"],
                                       rtol=1e-6)
    # the next step starts from the parameters this step produced
    first, second = ({t.value_meta(r)["name"]: t.read_value(r) for r in t.value_rows(e["index"])}
                     for e in steps[:2])
    np.testing.assert_allclose(second["params/Dense_0/kernel"],
                               first["params/Dense_0/kernel"] + first["updates/Dense_0/kernel"], rtol=1e-6)


def test_manifest_says_how_and_where_it_was_recorded(gru):
    m = tracediff.load(gru[0]).manifest
    assert m["recording"]["level"] == "full" and m["recording"]["loops"] == "opaque"
    jax_m = m["frameworks"]["jax"]
    assert jax_m["jax_enable_x64"] is True and jax_m["mode"].startswith("shadow")
    assert jax_m["replay_errors"] == [] and jax_m["backend"] == "cpu"
    fidelity = jax_m["replay_vs_compiled"]  # how far replay is from the compiled program here
    assert fidelity["calls_compared"] == jax_m["calls"]
    assert 0 <= fidelity["calls_where_replay_differs"] <= fidelity["calls_compared"]
    assert 0 <= fidelity["calls_measured"] <= fidelity["calls_where_replay_differs"]
    assert m["packages"]["jax"] == jax_m["version"]
    assert m["script"]["name"] == GRU and len(m["script"]["sha256"]) == 64
    assert m["script"]["argv"][1:] == ["--steps", STEPS]
    assert m["end"] == {"status": "completed", "exit_code": 0}
    assert m["cpu"]["count"] >= 1 and "python" in m



def test_replay_differences_are_counted_every_call_and_measured_at_chosen_ones():
    """Whether a call's replay differs from its compiled outputs is known at every call
    (by the hashes both sides were written with, or their bytes); by how much at each
    jitted function's first 8 differing calls, then its 16th, 32nd, 64th...: the
    manifest's max_rel_difference is over `calls_measured` of them, never more."""
    import weakref

    from tracediff.capture.jax.replay import _max_rel_difference, _Replay, measured_call
    from tracediff.trace import values

    class Calls(_Replay):   # the replay's bookkeeping, without a recording around it
        def __init__(self):
            self.fidelity = {"calls_compared": 0, "calls_where_replay_differs": 0,
                             "calls_measured": 0, "max_rel_difference": 0.0, "examples": []}
            self._differing_calls, self._hashed = {}, {}

    assert [k for k in range(1, 100) if measured_call(k)] == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]
    rec = Calls()
    compiled = np.linspace(1, 2, 4096, dtype=np.float32)
    worst = {}
    for k in range(1, 21):
        replayed = compiled * np.float32(1 + k * 1e-3)
        worst[k] = _max_rel_difference(replayed, compiled)
        rec._hashed = {id(x): (weakref.ref(x), values.digest(x)) for x in (replayed, compiled)}
        rec._measure_replay("step", [replayed], [compiled])
        rec._hashed = {}
        rec._measure_replay("init", [compiled.copy()], [compiled])   # the same bytes, unhashed
    fid = rec.fidelity
    assert (fid["calls_compared"], fid["calls_where_replay_differs"], fid["calls_measured"]) == \
        (40, 20, 9)
    assert fid["max_rel_difference"] == worst[16] and worst[16] < worst[20]
    assert fid["examples"] == ["step"]


# fixtures/jax_fused_fma.py: each jit call's outputs are these equations' results
FMA_OUTPUTS = {"jit:true_divide": ("div",), "jit:schedule": ("add", "reduce_sum")}


@pytest.fixture(scope="module")
def fma(recorded):
    """fixtures/jax_fused_fma.py with this CPU's ISA and with SSE4.2 (as test_jax_locate)."""
    from .conftest import XLA_SSE4

    return recorded.many({"fma": ("jax_fused_fma.py", (), None),
                          "sse": ("jax_fused_fma.py", (), XLA_SSE4)})


def _replay_differs(path):
    """{call op: whether its compiled outputs differ from its replayed equations' results}
    by the bytes a level-full trace holds (the truth of `replay_vs_compiled`)."""
    out = {}
    with tracediff.load(path) as t:
        evs = events(t)
        for call in (e for e in evs if e["kind"] == "call"):
            inner = {e["op"]: e["index"] for e in evs if e["call"] == call["index"]}
            compiled = [t.read_value(r) for r in t.value_rows(call["index"], schema.ROLE_OUT)]
            replayed = [t.read_value(t.value_rows(inner[op], schema.ROLE_OUT)[0])
                        for op in FMA_OUTPUTS[call["op"]]]
            assert len(compiled) == len(replayed)
            out[call["op"]] = any(c.tobytes() != r.tobytes() for c, r in zip(compiled, replayed))
    return out


def _fma_truth(fma):
    """`_replay_differs` of the recording with this CPU's ISA, where its FMA decides."""
    truth = _replay_differs(fma["fma"])
    if not truth["jit:schedule"]:
        pytest.skip("XLA contracts no FMA on this CPU (no FMA in its ISA): the compiled "
                    "schedule rounds as its replay does, no call's replay differs")
    return truth


def _check_replay_counts(path, truth):
    with tracediff.load(path) as t:
        fid = t.manifest["frameworks"]["jax"]["replay_vs_compiled"]
    differs = [op.split(":", 1)[1] for op, d in truth.items() if d]
    assert (fid["calls_compared"], fid["calls_where_replay_differs"], fid["calls_measured"]) \
        == (len(truth), len(differs), len(differs)), (fid, truth)
    assert fid["examples"] == differs, (fid, truth)


def test_the_call_whose_compiled_program_rounds_otherwise_is_counted(fma):
    """XLA contracts `t * rate + offset` into one FMA where the ISA has it; replayed one
    equation at a time it rounds twice. `replay_vs_compiled` counts that call and only it
    (the division rounds alike), by the hashes both sides were written with; under SSE4.2
    the schedule's replay is its compiled program's. Truth: the trace's bytes."""
    sse = _replay_differs(fma["sse"])
    assert sse == {"jit:true_divide": False, "jit:schedule": False}, sse
    _check_replay_counts(fma["sse"], sse)
    truth = _fma_truth(fma)
    assert truth == {"jit:true_divide": False, "jit:schedule": True}, truth
    _check_replay_counts(fma["fma"], truth)


@pytest.mark.deep   # the device path forced on XLA:CPU: CI's deep stage
def test_calls_hashed_on_the_device_are_compared_by_their_bytes(fma, recorded):
    """On an accelerator values are hashed on the device and read later: at a call's end
    neither its replayed nor its compiled outputs have a hash, and their bytes are compared.
    The same program recorded so (forced on XLA:CPU, --level stats) counts the same call
    as the level-full trace's bytes say (the truth)."""
    truth = _fma_truth(fma)
    dev = recorded("jax_fused_fma.py", env={"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1"},
                   options=("--level", "stats"))
    with tracediff.load(dev) as t:
        assert t.manifest["frameworks"]["jax"]["digests_on_device"]   # the premise
    _check_replay_counts(dev, truth)


def test_replay_fidelity_is_measured_over_every_element():
    """The manifest's max relative difference between replayed and compiled outputs: the
    recorder compares only the elements that differ, in float64; the truth here is one
    complex128 pass over whole arrays (numpy), with NaN, inf, -0.0 and complex values."""
    from tracediff.capture.jax.replay import _max_rel_difference
    from tracediff.trace.values import same_bytes as _same_bytes

    def truth(r, c):
        if r.tobytes() == c.tobytes():
            return None
        with np.errstate(all="ignore"):
            rel = np.abs(r.astype(np.complex128) - c) / np.maximum(np.abs(c), np.finfo(r.dtype).tiny)
            return max(0.0, float(np.nanmax(np.abs(rel)))) if not np.isnan(rel).all() else 0.0

    rng = np.random.default_rng(0)
    cases = []
    for dtype in (np.float32, np.float64, np.float16, np.complex64):
        c = rng.standard_normal((64, 33)).astype(dtype)
        if dtype == np.complex64:
            c = (c + 1j * rng.standard_normal((64, 33))).astype(dtype)
        r = c.copy()
        r.flat[5] = r.flat[5] + 0.1234567   # the largest difference, not a round ratio
        r.flat[7] = np.nan
        r.flat[9] = r.flat[9] * 1.0001
        cases.append((r, c))
        cases.append((c.copy(), c))                              # equal
    c = rng.standard_normal((200, 200)).astype(np.float32)        # more than one chunk
    cases.append(((c * np.float32(1.0001)).astype(np.float32), c))
    # float32 arrays of a chunk or more are searched in float32 first; where that quotient
    # overflows (a difference past float32's range, not the largest in float64; a huge
    # difference over a denormal), where only the bytes differ, or where many elements tie
    # with the largest, the answer is still the float64 one
    big = rng.standard_normal(1 << 16).astype(np.float32)
    over = big.copy()
    big[3], over[3] = 3e38, -3e38           # float32 difference: inf; float64 quotient: 2
    big[5], over[5] = 1e-40, 1e-3           # the largest: 1e-3 / tiny
    cases.append((over, big.copy()))
    over = big.copy()
    over[7], over[8] = 1e3, 2e3             # both quotients past float32's range
    cases.append((over, big.copy()))
    zeros = np.zeros(1 << 16, np.float32)
    cases.append((-zeros, zeros))
    cases.append((np.nextafter(big, np.float32(np.inf)), big))   # every element one ulp up
    near = np.full(1 << 16, 1.0, np.float32)
    cases.append((near + np.linspace(0, 1e-6, near.size, dtype=np.float32), near))
    z = np.zeros(4, np.float32)
    cases.append((-z, z))                                        # only the bytes differ
    cases.append((np.full(3, np.nan, np.float32), np.ones(3, np.float32)))   # all NaN
    cases.append((np.array([np.inf, 1.0], np.float32), np.array([np.inf, 2.0], np.float32)))
    for r, c in cases:
        expected = truth(r, c)
        assert _same_bytes(r, c) == (expected is None)
        if expected is not None:
            assert _max_rel_difference(r, c) == expected, (r.dtype, expected)
    ints = np.arange(6, dtype=np.int64)
    assert _same_bytes(ints, ints.copy()) and not _same_bytes(ints, ints[::-1].copy())


def test_control_flow_is_stepped_into(flow):
    proc, opaque, _, stepped = flow
    assert proc.stdout.count("debug value 4") == 1, "a debug print ran twice under replay"
    t = tracediff.load(opaque)
    evs = events(t)
    by_op = {}
    for e in evs:
        by_op.setdefault("jit" if e["op"].startswith("jit:") else e["op"], []).append(e)
    # nested jit, custom_jvp, remat and the cond branch taken are entered
    for outer, inner in (("jit", "sin"), ("custom_jvp_call", "max"), ("remat2", "cos"), ("cond", "mul")):
        outers = {e["index"] for e in by_op[outer]}
        assert any(outers & ancestors(evs, e) for e in by_op[inner]), (outer, inner)
    assert not any(e["iter"] >= 0 for e in evs)  # loops opaque by default
    bf16 = [t.value_meta(r)["dtype"] for e in by_op["convert_element_type"] for r in t.value_rows(e["index"])]
    assert "bfloat16" in bf16
    ts = tracediff.load(stepped)
    iters = {e["iter"] for e in events(ts) if e["iter"] >= 0}
    assert iters == set(range(6)) and ts.manifest["recording"]["loops"] == "stepped"
    # stepped and opaque loops give the same loop outputs
    for op in ("scan", "while"):
        a = [t.read_value(r) for e in events(t) if e["op"] == op for r in t.value_rows(e["index"])]
        b = [ts.read_value(r) for e in events(ts) if e["op"] == op for r in ts.value_rows(e["index"])]
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6)


def test_bfloat16_and_keys_round_trip_exactly(flow):
    t = tracediff.load(flow[1])
    import ml_dtypes

    for e in events(t):
        for r in t.value_rows(e["index"]):
            meta = t.value_meta(r)
            if meta["dtype"] == "bfloat16":
                v = t.read_value(r)
                assert v.dtype == ml_dtypes.bfloat16
                assert v.view(np.uint16).tobytes() == t._f["blob"][r["offset"]:r["offset"] + r["nbytes"]].tobytes()
    keys = [t.value_meta(r)["dtype"] for r in t.values]
    assert any(k.startswith("key<") for k in keys)


def test_crashing_script_leaves_a_readable_trace(tmp_path):
    out = tmp_path / "crash.h5"
    proc = record(FLOW, out, "--crash", check=False)
    assert proc.returncode == 1
    assert "RuntimeError: deliberate failure" in proc.stderr and "tracediff/" not in proc.stderr
    t = tracediff.load(out)
    assert t.complete and len(t) > 10
    assert t.manifest["end"]["status"] == "exception"
    assert t.manifest["end"]["exception"] == "RuntimeError"
    proc = record(FLOW, tmp_path / "exit.h5", "--exit", check=False)
    assert proc.returncode == 3
    assert tracediff.load(tmp_path / "exit.h5").manifest["end"]["exit_code"] == 3


@pytest.mark.parametrize("args, message", [
    (("record", "-o", "x.h5", "no_such_script.py"), "no such script"),
    (("record", "-o", "/no/such/folder/x.h5", "fixtures/jax_control_flow.py"), "does not exist"),
])
def test_record_bad_input_is_one_line_exit_2(args, message, tmp_path):
    proc = run_cli(*args, cwd=None)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_trace_is_readable_with_plain_h5py(gru):
    """Follows docs/format.md with h5py and numpy only."""
    with h5py.File(gru[0], "r") as f:
        assert f.attrs["format"] == "tracediff.trace" and f.attrs["schema_version"] == 1
        manifest = json.loads(f["manifest"][()])
        strings = [s.decode() for s in f["strings"][:]]
        events_ = f["events"][:]
        values = f["values"][:]
        blob = f["blob"]
        tanh = [i for i, e in enumerate(events_) if strings[e["op"]] == "tanh"][0]
        row = values[values["event"] == tanh][0]
        raw = blob[row["offset"]:row["offset"] + row["nbytes"]].tobytes()
        shape = tuple(int(d) for d in strings[row["shape"]].split(",") if d)
        value = np.frombuffer(raw, dtype=strings[row["storage"]]).reshape(shape)
        assert manifest["script"]["name"] == GRU
    t = tracediff.load(gru[0])
    np.testing.assert_array_equal(value, t.read_value(t.value_rows(tanh)[0]))


EAGER_ADAM = '''
import jax, jax.numpy as jnp, optax
p = {"w": jnp.ones(3)}
opt = optax.adam(0.1)
s = opt.init(p)
for i in range(4):  # no jit: optax's own jnp calls run as jit calls inside each update
    g = jax.grad(lambda q: jnp.sum(q["w"] ** 2))(p)
    u, s = opt.update(g, s, p)
    p = optax.apply_updates(p, u)
print(p["w"])
'''


def test_eager_optax_update_is_one_step(tmp_path):
    """An eager update calls jitted helpers; none of them may end the step early."""
    script = tmp_path / "eager_adam.py"
    script.write_text(EAGER_ADAM)
    full, calls = tmp_path / "full.h5", tmp_path / "calls.h5"
    record(str(script), full)
    record(str(script), calls, extra=("--level", "calls"))
    t = tracediff.load(full)
    steps = [e for e in events(t) if e["kind"] == "optim"]
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    assert t.manifest["frameworks"]["jax"]["optimizer_steps"] == 4
    for k, e in enumerate(steps):
        vals = {t.value_meta(r)["name"]: t.read_value(r) for r in t.value_rows(e["index"])}
        assert set(vals) == {"grads/w", "params/w", "updates/w", "state/count", "state/mu/w",
                             "state/nu/w"}
        assert int(vals["state/count"]) == k + 1
    t = tracediff.load(calls)   # calls level: steps counted, not recorded
    assert t.manifest["frameworks"]["jax"]["optimizer_steps"] == 4
    assert not [e for e in events(t) if e["kind"] == "optim"]


def test_a_params_summary_never_cuts_a_value_in_the_middle():
    """An equation's params over the caps (60 characters a value, 240 in all) are marked
    `...`, which replay reads as "shortened"; a convolution's are written whole. Before:
    each value's repr was cut at 60 characters and the whole at 240, mid-token
    (`rhs_spec=(3, 2, , feature_group_count=1`), so replay could not even tell."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from tracediff.capture.jax.sites import summarize_params
    from tracediff.diff.explain.replay.params import CannotReplay, parse_params

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 2), ((1, 1), (2, 0)), rhs_dilation=(2, 1),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

    eqn = jax.make_jaxpr(conv)(jnp.ones((2, 9, 9, 3)), jnp.ones((3, 3, 3, 4))).jaxpr.eqns[0]
    text = summarize_params(eqn.params, eqn.primitive.name)
    assert "dimension_numbers=ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, " \
           "1), out_spec=(0, 3, 1, 2))" in text and len(text) > 240 and "..." not in text
    params = parse_params(text)
    assert params["padding"] == ((1, 1), (2, 0)) and params["window_strides"] == (1, 2)
    assert params["dimension_numbers"] == ("conv_dims", ((0, 3, 1, 2), (3, 2, 0, 1),
                                                         (0, 3, 1, 2)))
    assert summarize_params({"a": "x" * 70, "b": 1}) == "a=..., b=1"
    many = summarize_params({f"k{i:02}": "v" * 50 for i in range(9)})
    assert len(many) <= 240 and many.endswith(", ...") and "k03='" + "v" * 50 + "'" in many
    for cut in ("a=..., b=1", many):
        with pytest.raises(CannotReplay, match="shortened"):
            parse_params(cut)


LONG_PATHS = '''
import jax, jax.numpy as jnp, optax
from flax import linen as nn

class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="a_projection_whose_name_is_long_like_hf_ones")(x)

class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Block(name="encoder_stage_with_a_long_descriptive_name")(x).sum()

m = Model()
x = jnp.ones((2, 4))
p = m.init(jax.random.PRNGKey(0), x)
opt = optax.adam(0.1)
s = opt.init(p)

@jax.jit
def step(p, s):
    g = jax.grad(lambda q: m.apply(q, x))(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

p, s = step(p, s)
print(float(jax.tree_util.tree_leaves(p)[0].sum()))
'''


DONATED_ADAM = '''
import sys
import jax, jax.numpy as jnp, numpy as np, optax
FOLDER = sys.argv[1]
p = {"w": jnp.arange(1, 5, dtype=jnp.float32)}
opt = optax.adam(0.1)
s = opt.init(p)

def step(p, s):
    g = jax.grad(lambda q: jnp.sum(q["w"] ** 3))(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

step = jax.jit(step, donate_argnums=(0, 1))
for i in range(3):
    np.save(f"{FOLDER}/params{i}.npy", np.asarray(p["w"]))
    p, s = step(p, s)
print(p["w"])
'''


def test_optax_values_of_a_donating_step_are_stored(tmp_path):
    """A jitted step that donates its parameters and optimizer state: the step's optax
    snapshot still holds every value, the params being the bytes the script passed in.
    (The replay keeps its tagged values for the snapshot without copying them, except the
    call's donated arguments, which the compiled call deletes before the snapshot is
    written.)"""
    script = tmp_path / "donated_adam.py"
    script.write_text(DONATED_ADAM)
    out = tmp_path / "donated.h5"
    record(str(script), out, str(tmp_path))
    with tracediff.load(out) as t:
        steps = [e for e in events(t) if e["kind"] == "optim"]
        assert [e["step"] for e in steps] == [0, 1, 2]
        for k, e in enumerate(steps):
            rows = t.value_rows(e["index"])
            vals = {t.value_meta(r)["name"]: t.read_value(r) for r in rows}
            assert set(vals) == {"grads/w", "params/w", "updates/w", "state/count",
                                 "state/mu/w", "state/nu/w"}
            assert all(v is not None for v in vals.values()), vals
            np.testing.assert_array_equal(vals["params/w"], np.load(tmp_path / f"params{k}.npy"))
            assert int(vals["state/count"]) == k + 1


def test_optimizer_tags_of_long_parameter_paths_are_recorded_whole(tmp_path):
    """The checkpoint name that tags a gradient (`tracediff:optax/grads/<path>`) is what a
    port's pairing seeds its backward from; HF modules' paths are long. Before: a name over
    60 characters was written `name=...`, and an HF ResNet port's backward went from 166 to
    80 of 170 JAX units paired (INCONCLUSIVE on a correct port)."""
    from tracediff.capture.jax.sites import summarize_params

    tag = "tracediff:optax/grads/params/" + "x" * 80
    assert summarize_params({"name": tag}, "name") == f"name={tag!r}"
    script = tmp_path / "long_paths.py"
    script.write_text(LONG_PATHS)
    trace = tmp_path / "t.h5"
    record(str(script), trace)
    t = tracediff.load(trace)
    names = [e["params"] for e in events(t) if e["op"] == "name"]
    grads = [n for n in names if "tracediff:optax/grads/" in n]
    path = ("params/encoder_stage_with_a_long_descriptive_name/"
            "a_projection_whose_name_is_long_like_hf_ones")
    assert {f"name='tracediff:optax/grads/{path}/{leaf}'" for leaf in ("bias", "kernel")} \
        <= set(grads), names


CALLBACK = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback


def seen(v):
    print("callback", float(v), flush=True)
    return np.float32(v)


@jax.jit
def f(x):
    y = io_callback(seen, jax.ShapeDtypeStruct((), jnp.float32), x.sum())
    return x * 2 + y


for _ in range(2):
    print(np.asarray(f(jnp.ones(3))), flush=True)
"""


@pytest.mark.parametrize("values", ["replay", "compiled"])
def test_a_call_whose_callback_the_script_sees_runs_once(tmp_path, values):
    """A jitted function with an io_callback is recorded by its inputs and outputs alone:
    neither the replay nor the values program (`--jax-values compiled`, the accelerator
    default) runs it again, so the script prints what it prints plain. Before: the values
    program called the callback a second time at every call."""
    from .helpers import run_plain

    script = tmp_path / "callback.py"
    script.write_text(CALLBACK)
    trace = tmp_path / "t.h5"
    plain = run_plain(str(script)).stdout
    got = record(str(script), trace, extra=("--jax-values", values)).stdout
    assert plain.count("callback") == 2
    assert got == plain
    with h5py.File(trace, "r") as f:
        jm = json.loads(f["manifest"][()])["frameworks"]["jax"]
    assert jm["calls_not_replayed"] == 2
