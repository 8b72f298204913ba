"""`tracediff locate` on real JAX divergences: identical runs, an XLA ISA switch, a one-ULP tanh."""

import json

import tracediff

from .conftest import XLA_SSE4
from .helpers import locate_json, run_cli


def test_identical_runs_match(jax_gru):
    a, a2 = jax_gru["a"][0], jax_gru["a2"][0]
    report = locate_json(a, a2)
    assert report["verdict"] == "match"
    assert report["first_difference"] is None and report["first_beyond_tolerance"] is None
    al = report["alignment"]
    assert al["matched"] == al["events_a"] == al["events_b"]
    proc = run_cli("locate", a, a2)
    assert proc.returncode == 0 and proc.stdout.startswith("MATCH")


def test_isa_switch_is_located_at_an_op_whose_inputs_match(jax_gru):
    a, isa = jax_gru["a"], jax_gru["isa"]
    assert a[1].stdout != isa[1].stdout, "SSE4.2 code generation no longer changes the result here"
    report = locate_json(a[0], isa[0])
    assert report["verdict"] == "diverged"
    first = report["first_difference"]
    assert first is not None and first["inputs_match"] is True
    assert first["a"]["step"] == 0 and first["metrics"]["max_abs"] > 0
    assert first["a"]["op"] == first["b"]["op"]
    beyond = report["first_beyond_tolerance"]
    assert beyond is not None and beyond["metrics"]["max_rel"] > 0
    assert beyond["a"]["index"] >= first["a"]["index"]
    keys = {d["key"] for d in report["env_diff"]}
    assert "env.XLA_FLAGS" in keys
    assert report["optimizer_steps"], "optimizer steps were not compared"


def test_one_ulp_tanh_is_located_at_tanh_and_its_source_line(jax_gru):
    a, bad = jax_gru["a"], jax_gru["tanh"]
    report = locate_json(a[0], bad[0])
    first = report["first_difference"]
    assert first["a"]["op"] == "tanh"
    assert first["a"]["source"] == "jax_gru_expm_adam.py:25"
    assert "GRUCell_0" in first["a"]["name_stack"]
    assert first["inputs_match"] is True
    assert first["metrics"]["max_ulp"] == 1
    proc = run_cli("locate", a[0], bad[0])
    assert "tanh" in proc.stdout and "jax_gru_expm_adam.py:25" in proc.stdout


def test_compiled_call_divergence_is_narrowed_by_its_probe(recorded):
    """XLA contracts `t * rate + offset` into one FMA where the ISA has it (not under
    SSE4.2): the compiled outputs differ, every replayed equation matches. locate says so
    and prints the `record --probe` commands; on the probed traces it names the `add`."""
    probe = ("--probe", "^schedule$")
    t = recorded.many({"a": ("jax_fused_fma.py", (), None),
                       "b": ("jax_fused_fma.py", (), XLA_SSE4),
                       "ap": ("jax_fused_fma.py", (), None, probe),
                       "bp": ("jax_fused_fma.py", (), XLA_SSE4, probe)})
    runs = {k: recorded.proc(p) for k, p in t.items()}
    assert runs["a"].stdout != runs["b"].stdout, "SSE4.2 no longer changes the fused program here"
    assert runs["ap"].stdout == runs["a"].stdout, "the probe changed the script's result"
    r = locate_json(t["a"], t["b"])
    fd = r["first_difference"]
    assert fd["a"]["op"] == "jit:schedule" and fd["inputs_match"] is True
    assert "every replayed equation of this call matches" in fd["note"]
    zoom = r["levels"]["zoom"][0]
    assert "--probe '^schedule$' --steps 0:1" in zoom["a"]["command"]
    assert zoom["b"]["command"].startswith("XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 ")
    assert any("--probe" in line for line in r["next_steps"])

    r = locate_json(t["ap"], t["bp"])
    fd = r["first_difference"]
    assert (fd["a"]["op"], fd["origin"], fd["inputs_match"]) == ("add", "probe", True)
    assert fd["a"]["source"].endswith("jax_fused_fma.py:14")
    assert fd["call"]["op"] == "jit:schedule" and "compiled probe" in fd["note"]
    # the probe computed what the script saw: its final outputs equal the compiled ones
    with tracediff.load(t["bp"]) as tr:
        info = tr.manifest["frameworks"]["jax"]["probe"]
    assert info["calls"] == 1 and info["final_outputs_equal_compiled"] == 1
    proc = run_cli("explain", t["ap"], t["bp"], "--json")
    an = json.loads(proc.stdout)
    cc = an["compiled_call"]
    assert cc["narrowed_to"]["op"] == "add" and cc["probe"] is not None
    # run alone, the add rounds twice (no contraction): this machine gives SSE4.2's value
    assert an["replay"]["reproduces"] == "b" and "FMA" in cc["explanation"]


def _optax_params(path, step):
    """{name: bytes} of the params/ values of the optax snapshot of `step` (what `update`
    was given: the parameters entering that step)."""
    from tracediff.trace import schema

    with tracediff.load(path) as t:
        ev = next(i for i in range(len(t)) if t.event(i)["op"] == "optim:optax" and
                  t.event(i)["step"] == step)
        return {t.string(r["name"]): t.read_value(r).tobytes()
                for r in t.value_rows(ev, schema.ROLE_OUT)
                if r["name"] >= 0 and t.string(r["name"]).startswith("params/")}


def test_optax_steps_compare_the_parameters_after_the_step(recorded):
    """"Parameters first differ after step N" means the same in JAX as in torch. optax.adamw
    with and without a weight-decay mask on the biases: the biases start at zero, so the
    decay changes nothing in step 0 and changes the biases in step 1. The truth from the
    snapshots themselves (optax's holds the params its update was given): the params step
    1 was given (after step 0) are equal, the ones step 2 was given (after step 1) differ.
    Before, JAX's "snapshot of step N" held the parameters entering step N (here: first
    differ in the snapshot of step 2), torch's those after it."""
    args = ("--side", "flax", "--hidden", "12", "--adamw", "--steps", "3")
    runs = recorded.many({"a": ("port_mlp_adam.py", args, None),
                          "b": ("port_mlp_adam.py", args + ("--decay-mask",), None)})
    a, b = runs["a"], runs["b"]
    assert _optax_params(a, 1) == _optax_params(b, 1)
    assert _optax_params(a, 2) != _optax_params(b, 2)
    r = tracediff.locate(a, b)
    steps = r.optimizer_steps
    assert [s.step for s in steps] == [0, 1, 2]
    assert steps[0].bitwise_equal and not steps[1].bitwise_equal
    assert "bias" in steps[1].worst
    # the last step has no next snapshot: params + updates, as optax.apply_updates computes
    assert not steps[2].bitwise_equal and steps[2].rel_l2 > 0
    proc = run_cli("locate", a, b, "--no-explain")
    assert "parameters first differ after step 1" in proc.stdout
