"""An optimizer's settings recorded and named as the cause (docs/ports.md, "Optimizer
settings"): fixtures/port_mlp_adam.py trains its Flax MLP with optax and the torch port with
torch.optim in one process, optax's Adam given another `b2` or `eps` than torch's.

What a user relies on: the settings each framework exposes are in the trace at every step
(torch's `param_groups`, optax's transformations and `inject_hyperparams` state); where
the grads agree and the optimizer state or step does not, the finding names the setting
with the value on each side, and never sends the user "upstream (the forward or backward
pass)"; a trace recorded before the settings were reads and says they were not recorded.
"""

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.trace import schema

from .helpers import FIXTURES, ROOT, run_cli, script_env

# CI's 'deep' stage (pytest -m deep): several recordings, each against its truth
pytestmark = pytest.mark.deep

SCRIPT = os.path.join(FIXTURES, "port_mlp_adam.py")
JOBS = {"ok": (), "b2": ("--flax-b2", "0.95"), "eps": ("--flax-eps", "1e-3"),
        "hyper_b2": ("--hyperparams", "--flax-b2", "0.95")}
BATCH = r"""
import json, sys
from tracediff.runner.script import record_script

for name, args in json.loads(sys.argv[3]).items():
    rc = record_script(sys.argv[2], args, sys.argv[1] + "/" + name + ".h5", frameworks=("jax", "torch"))
    if rc:
        sys.exit(name + ": the script exited " + str(rc))
"""
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("optsettings")
    env = script_env()
    env.pop("XLA_FLAGS", None)
    jobs = {k: list(v) for k, v in JOBS.items()}
    run = subprocess.run([sys.executable, "-c", BATCH, str(d), SCRIPT, json.dumps(jobs)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return {k: str(d / f"{k}.h5") for k in JOBS}


_RESULTS = {}


def _locate(path):
    if path not in _RESULTS:
        _RESULTS[path] = tracediff.locate(path, explain=False)
    return _RESULTS[path]


def _snapshots(path):
    """[(step, {jax value name: array}, {torch value name: array})] of the optimizer steps,
    read by name (no pairing, no comparison of tracediff's)."""
    out = []
    with tracediff.load(path) as t:
        ev = t.events
        snaps = [e for e in range(len(t)) if ev["kind"][e] == schema.KIND_OPTIM]
        fws = {fw: [e for e in snaps if ev["framework"][e] == fw]
               for fw in (schema.FW_JAX, schema.FW_TORCH)}
        for ej, et in zip(fws[schema.FW_JAX], fws[schema.FW_TORCH]):
            vals = [{t.string(r["name"]): t.read_value(r) for r in t.value_rows(e, schema.ROLE_OUT)}
                    for e in (ej, et)]
            out.append((int(ev["step"][ej]), *vals))
    return out


def _beyond(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) > RTOL * np.linalg.norm(a) + ATOL * np.sqrt(a.size)


def _truth(path):
    """[(step, role, torch parameter, beyond)] in the order a step computes them (grads,
    exp_avg, exp_avg_sq, the parameter after the step), torch's parameter order: numpy on
    the values each side stored, the Flax kernel transposed."""
    out = []
    for step, ja, tb in _snapshots(path):
        params = [n[len("params/"):] for n in tb if n.startswith("params/")]
        ja = {n.replace("state/inner_state/", "state/"): x for n, x in ja.items()}
        rows = {}
        for name in params:
            mod, leaf = name.split(".")
            key = f"params/{mod}/{'kernel' if leaf == 'weight' else 'bias'}"
            lay = (lambda x: np.asarray(x).T) if leaf == "weight" else np.asarray
            pairs = {"grads": (ja[f"grads/{key}"], tb[f"grads/{name}"]),
                     "exp_avg": (ja[f"state/mu/{key}"], tb[f"state/{name}/exp_avg"]),
                     "exp_avg_sq": (ja[f"state/nu/{key}"], tb[f"state/{name}/exp_avg_sq"]),
                     "params": (ja[f"params/{key}"] + ja[f"updates/{key}"], tb[f"params/{name}"])}
            for role, (a, b) in pairs.items():
                rows.setdefault(role, []).append((step, role, name, _beyond(a, lay(b))))
        for role in ("grads", "exp_avg", "exp_avg_sq", "params"):
            out += rows[role]
    return out


def _first(truth):
    return next(((s, role, n) for s, role, n, b in truth if b), None)


def test_settings_are_recorded_at_every_step(traces):
    """torch's param_groups and optax's transformations, per optimizer step (jit traces
    optax's update once: its settings are kept for every step after)."""
    with tracediff.load(traces["b2"]) as t:
        ev = t.events
        snaps = [e for e in range(len(t)) if ev["kind"][e] == schema.KIND_OPTIM]
        assert len(snaps) == 4
        for e in snaps:
            rows = {k: (v, text) for _, k, v, text in t.optim_settings(e)}
            if ev["framework"][e] == schema.FW_TORCH:
                assert rows["lr"][0] == pytest.approx(1e-2) and rows["betas/1"][0] == 0.999
                assert rows["eps"][0] == 1e-8 and rows["weight_decay"][0] == 0.0
                assert rows["amsgrad"] == (0.0, "False") and rows["maximize"] == (0.0, "False")
                assert {"foreach", "fused", "params"} <= set(rows)
            else:
                assert rows["chain/0/scale_by_adam/b2"] == (0.95, "0.95")
                assert rows["chain/0/scale_by_adam/eps"][0] == 1e-8
                assert rows["chain/1/scale/step_size"][0] == pytest.approx(-1e-2)


def test_correct_port_matches(traces):
    assert _first(_truth(traces["ok"])) is None
    r = _locate(traces["ok"])
    assert r.first_parameter is None and r.verdict == "match", r.first_parameter


def test_b2_named_with_both_values_where_the_grads_agree(traces):
    """b2 0.95 against 0.999: the grads and exp_avg agree, exp_avg_sq does not at step 0.
    It was 'the divergence is upstream (the forward or backward pass)'."""
    truth = _truth(traces["b2"])
    first = _first(truth)
    assert first[:2] == (0, "exp_avg_sq")
    assert not any(b for s, role, _, b in truth if s == 0 and role == "grads")
    p = _locate(traces["b2"]).first_parameter
    assert (p.step, p.role, p.parameter) == first
    assert p.settings == [{"setting": "b2", "a": "0.95", "b": "0.999"}]
    assert p.settings_recorded is True
    assert "upstream" not in p.note and "its grads match" in p.note
    assert "b2 0.95 vs 0.999" in p.note
    res = run_cli("locate", traces["b2"])
    assert res.returncode == 1 and "b2 0.95 vs 0.999" in res.stdout
    assert "upstream" not in res.stdout.split("first parameter beyond tolerance")[1].split("\n")[1]
    js = json.loads(run_cli("locate", "--json", traces["b2"]).stdout)
    assert js["first_parameter"]["settings"] == [{"setting": "b2", "a": "0.95", "b": "0.999"}]


def test_eps_named_where_grads_and_state_agree(traces):
    """eps 1e-3 against 1e-8 changes no state, only the step: the parameters after it."""
    truth = _truth(traces["eps"])
    first = _first(truth)
    assert first[:2] == (0, "params")
    p = _locate(traces["eps"]).first_parameter
    assert (p.step, p.role, p.parameter) == first
    assert p.upstream_match is True and p.weight_decay is False
    assert p.settings == [{"setting": "eps", "a": "0.001", "b": "1e-08"}]
    assert "eps 0.001 vs 1e-08" in p.note and "upstream" not in p.note


def test_inject_hyperparams_settings_from_the_state(traces):
    """optax.inject_hyperparams keeps b2 in its state (a float32 0-d value), not in a
    closure: read from the optimizer snapshot."""
    first = _first(_truth(traces["hyper_b2"]))
    p = _locate(traces["hyper_b2"]).first_parameter
    assert (p.step, p.role, p.parameter) == first
    assert p.settings == [{"setting": "b2", "a": "0.95", "b": "0.999"}]


def test_a_trace_without_settings_reads_and_claims_no_setting(traces, tmp_path):
    """A trace of an older tracediff (no `optim_settings` table): it reads, and the cause
    says the grads match and the optimizer's step differs, settings not recorded."""
    old = str(tmp_path / "old.h5")
    shutil.copy(traces["b2"], old)
    with h5py.File(old, "r+") as f:
        del f["optim_settings"]
        del f.attrs["committed_optim_settings"]
    with tracediff.load(old) as t:
        assert len(t.optim_setting_rows) == 0
    r = tracediff.locate(old, explain=False)
    p = r.first_parameter
    assert p.role == "exp_avg_sq" and p.settings == [] and p.settings_recorded is False
    assert "upstream" not in p.note and "settings not recorded" in p.note


def test_the_worst_parameter_is_never_one_whose_gradient_is_noise():
    """A key projection's bias: its gradient is rounding noise throughout (the sides 1e-9
    apart, no digit in common) and Adam turns it into steps of up to lr, a relative L2 far
    above a LayerNorm scale's real difference (decay on one side). The worst is the scale;
    the bias only where nothing else differs."""
    from tracediff.diff.pairing.roles import _worst, noise_elements, worst_candidate

    rng = np.random.default_rng(0)
    g_noise_a, g_noise_b = rng.normal(0, 1e-9, 8), rng.normal(0, 1e-9, 8)
    g = rng.normal(0, 1e-2, 8)
    noise = noise_elements(g_noise_a, g_noise_b)
    assert noise.all() and not noise_elements(g, g * (1 + 1e-7)).any()
    cands = [worst_candidate(noise, "key.bias", 0.5, 2e-3),
             worst_candidate(noise_elements(g, g * (1 + 1e-7)), "ln.weight", 1e-4, 1e-4),
             worst_candidate(None, "fc.weight", 1e-5, 1e-5)]     # no gradient compared
    assert _worst(cands) == (1e-4, 1e-4, "ln.weight")
    assert _worst(cands[:1]) == (0.5, 2e-3, "key.bias")     # noise alone: named


# -- settings tracediff cannot format --------------------------------------------------------

@pytest.mark.parametrize("script, fw, skipped, kept", [
    (("torch_unformattable.py", "settings"), "torch",
     ["group 0 <Key>: RuntimeError", "group 0 note: RuntimeError"],
     {"lr": (0.1, "0.1"), "momentum": (0.5, "0.5")}),
    (("jax_optax_unformattable.py",), "jax", ["chain/1/scaled/config: RuntimeError"],
     {"chain/0/scale_by_adam/b2": (0.95, "0.95"), "chain/1/scaled/lr": (0.1, "0.1")})],
    ids=["torch", "optax"])
def test_a_setting_that_cannot_be_formatted_is_skipped_never_the_capture(recorded, script, fw,
                                                                         skipped, kept):
    """Issue 66: an optimizer setting whose repr, str, float or == raises (a learning rate
    of a float subclass, a `param_groups` key of the program's, a config whose attributes
    raise) stopped the torch capture at the first optimizer step ("torch capture stopped
    at event N"), and dropped every optax setting. Now that datum is skipped (a number is
    read by its base type: the rate is kept), the manifest counts and names it, `record`
    warns, and every step is recorded with the other settings."""
    from .helpers import run_plain

    out = recorded(*script)
    proc = recorded.proc(out)
    assert proc.returncode == 0 and proc.stdout == run_plain(*script).stdout, proc.stderr
    assert "capture stopped" not in proc.stderr.lower(), proc.stderr
    assert f"could not be read or formatted: left out of the trace ({skipped[0]}" in proc.stderr
    with tracediff.load(out) as t:
        m = t.manifest["frameworks"][fw]
        assert "recording_error" not in m and not m.get("replay_errors"), m
        assert m["skipped_settings"]["count"] == len(skipped)
        assert m["skipped_settings"]["first"] == skipped
        steps = [e for e in range(len(t)) if t.events["kind"][e] == schema.KIND_OPTIM]
        assert len(steps) == 3
        for e in steps:
            rows = {k: (v, text) for _, k, v, text in t.optim_settings(e)}
            assert {k: rows.get(k) for k in kept} == kept, rows
