"""HF transformers 4.57.6 BERT trained 2 steps in both frameworks in one process
(tests/field/programs/hf_bert_train.py: torch weights converted into Flax by transformers'
converter, optax.adamw against torch.optim.AdamW, the same hyper-parameters), recorded as a
user records it, and located in the one trace.

Truth, independently of tracediff: the script dumps both frameworks' parameters after every
step; here they are mapped (Flax path <-> torch name, kernels transposed) and compared with
numpy, per tensor (||flax - torch|| against rtol ||flax|| + atol sqrt(n), float32's 1e-5 and
1e-6: Adam's g / (|g| + eps) turns rounding in a near-zero gradient into 1e-6 absolute
element differences, so an element-wise test flags a correct port).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tracediff

from ..helpers import run_cli, script_env

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_bert_train.py")
RTOL, ATOL = 1e-5, 1e-6
CASES = {"ok": ("--grads",), "mask": ("--bug", "decay_mask"), "ok_eager": ("--attn", "eager"),
         "mask_eager": ("--attn", "eager", "--bug", "decay_mask")}


def record_with_dumps(program, cases, d):
    """{case: (trace, dump)}: `tracediff record PROGRAM ARGS --dump DUMP` for each case, the
    recordings at once (the dump: the parameters after each step, the truth's input)."""
    env = script_env()
    env.pop("XLA_FLAGS", None)
    procs, out = {}, {}
    for name, args in cases.items():
        trace, dump = str(d / f"{name}.h5"), str(d / f"{name}.npz")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tracediff", "record", "-o", trace, program, *args,
             "--dump", dump], env=env, cwd=str(d), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        out[name] = (trace, dump)
    for name, p in procs.items():
        text, _ = p.communicate(timeout=900)
        assert p.returncode == 0, text[-3000:]
    return out


def located_runs(program, cases, d):
    """{case: (trace, dump, locate's result)} (`record_with_dumps`, then `tracediff.locate`)."""
    return {k: (t, dump, tracediff.locate(t, explain=False))
            for k, (t, dump) in record_with_dumps(program, cases, d).items()}


def assert_decay_mask_named(r, dump, first):
    """The forgotten decay mask: the truth's first parameter beyond tolerance is `first`
    after step 0, and locate names it there, with the truth's relative L2 and the same
    parameters decayed on one side; a finding of the forward can only follow them. `first`:
    a name, or the names the truth's first may be on a CPU of the supported kind (where a
    parameter's gradient is rounding noise depends on the CPU's rounding)."""
    tr = truth(dump)
    step, (name, rel, _, _, _) = _first_beyond(tr)
    assert step == 0 and name in ((first,) if isinstance(first, str) else first), (step, name)
    p = r.first_parameter
    assert r.verdict == "diverged" and r.exit_code == 1
    assert (p.step, p.parameter) == (step, name)
    assert p.rel_l2 == pytest.approx(rel, rel=0.05) and p.weight_decay is True
    assert set(p.decay_parameters) == {n for n, _, beyond, _, _ in tr[step] if beyond}
    f = r.first_beyond_tolerance
    assert f is None or (f.a.step > step and f.inputs_match is False), f


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump)}, both recordings at once."""
    return record_with_dumps(PROGRAM, CASES, tmp_path_factory.mktemp("bert_train"))


def _flax_path(torch_name, flax_keys):
    """embeddings.LayerNorm.weight -> embeddings/LayerNorm/scale (and whether to transpose);
    a leaf both name alike (ViT's embeddings.cls_token) as it is."""
    mod, leaf = torch_name.rsplit(".", 1)
    base = mod.replace(".", "/")
    if leaf == "bias" or f"{base}/{leaf}" in flax_keys:
        return f"{base}/{leaf}", False
    for cand, transpose in (("kernel", True), ("scale", False), ("embedding", False)):
        if f"{base}/{cand}" in flax_keys:
            return f"{base}/{cand}", transpose
    raise AssertionError(torch_name)


def _torch_layout(kernel):
    """A Flax kernel in torch's layout: (in, out) -> (out, in), HWIO -> OIHW."""
    return np.transpose(kernel, (3, 2, 0, 1)) if kernel.ndim == 4 else kernel.T


NOISE = 1e-3    # a gradient element whose two sides differ by more than this fraction: noise
NOISE_TENSOR = 0.5   # a gradient whose two sides differ by more (relative L2): noise throughout


def _side(z, prefix, s, n, flax_keys):
    """Flax's value of torch parameter n at `prefix`/s, in torch's layout, as float64."""
    path, transpose = _flax_path(n, flax_keys)
    f = z[f"{prefix}/{s}/{path}"].astype(np.float64)
    return _torch_layout(f) if transpose else f


def _noise(z, s, n):
    """Where parameter n's gradient of step s is rounding noise (both sides' gradients
    dumped): the two sides apart by more than NOISE of the larger. None where the script
    dumped no gradients."""
    if f"torch_grad/{s}/{n}" not in z.files:
        return None
    keys = {k.split("/", 2)[2] for k in z.files if k.startswith(f"flax_grad/{s}/")}
    f, t = _side(z, "flax_grad", s, n, keys), z[f"torch_grad/{s}/{n}"].astype(np.float64)
    big = max(np.linalg.norm(f), np.linalg.norm(t))
    if big and np.linalg.norm(f - t) > NOISE_TENSOR * big:
        return np.ones(f.shape, bool)    # noise throughout: an element agreeing by chance too
    return np.abs(f - t) > NOISE * np.maximum(np.abs(f), np.abs(t))


def truth(dump, determined=True):
    """{step: [(torch name, rel L2, beyond, flax - torch, torch before the step)]}, the
    parameters in torch's named_parameters() order. `determined`: rel L2 and beyond judged
    where the parameter's gradient is no rounding noise (`_noise`) in this step or before: a
    key projection's bias, whose gradient softmax makes zero but for rounding, steps by up
    to lr on each side (Adam's m / (sqrt(v) + eps) of the noise), which the program does not
    determine, and its value stays undetermined after; unless the whole difference is
    decoupled weight decay (`_decay`), which the program determines."""
    z = np.load(dump)
    names = [k.split("/", 2)[2] for k in z.files if k.startswith("torch/init/")]
    steps = sorted({int(k.split("/")[1]) for k in z.files if k.startswith("torch/")
                    and k.split("/")[1] != "init"})
    out, noisy = {}, {}
    for s in steps:
        flax_keys = {k.split("/", 2)[2] for k in z.files if k.startswith(f"flax/{s}/")}
        rows = []
        for n in names:
            f = _side(z, "flax", s, n, flax_keys)
            t = z[f"torch/{s}/{n}"].astype(np.float64)
            before = z[f"torch/{s - 1}/{n}" if s else f"torch/init/{n}"].astype(np.float64)
            noise = _noise(z, s, n) if determined else None
            if noise is not None:     # an element once undetermined stays so
                noise = noisy[n] = noise | noisy.get(n, False)
            keep = Ellipsis if noise is None or _decay(f - t, before) else ~noise
            diff = np.linalg.norm(f[keep] - t[keep])
            ref = np.linalg.norm(f[keep])
            rows.append((n, diff / ref if ref else 0.0,
                         diff > RTOL * ref + ATOL * np.sqrt(f[keep].size), f - t, before))
        out[s] = rows
    return out


def _decay(diff, before):
    """The whole difference is c times the parameter before the step (decoupled weight decay
    on one side, within 5 %): determined by the program wherever the gradient is noise."""
    d, p = diff.reshape(-1), before.reshape(-1)
    if not (d @ d) or not (p @ p):
        return False
    c = (d @ p) / (p @ p)
    return np.linalg.norm(d - c * p) < 0.05 * np.linalg.norm(d)


def undetermined(dump):
    """{step: {torch name}}: the parameters beyond tolerance only where their gradient is
    rounding noise (`truth`)."""
    every, det = truth(dump, determined=False), truth(dump)
    return {s: {r[0] for r, d in zip(every[s], det[s]) if r[2] and not d[2]} for s in every}


def _first_beyond(tr):
    for s in sorted(tr):
        for row in tr[s]:
            if row[2]:
                return s, row
    return None, None


@pytest.fixture(scope="module")
def two_scripts(tmp_path_factory):
    """The decay-mask port as two scripts, one trace each: (flax trace, torch trace, dump of
    the flax side, dump of the torch side)."""
    d = tmp_path_factory.mktemp("bert_train_two")
    env = script_env()
    procs, out = [], []
    for side, fw, extra in (("flax", "jax", ("--bug", "decay_mask")), ("torch", "torch", ())):
        trace, dump = str(d / f"{side}.h5"), str(d / f"{side}.npz")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tracediff", "record", "--framework", fw, "-o", trace,
             PROGRAM, "--side", side, *extra, "--dump", dump], env=env, cwd=str(d),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        out += [trace, dump]
    for p in procs:
        text, _ = p.communicate(timeout=900)
        assert p.returncode == 0, text[-3000:]
    merged = str(d / "both.npz")       # the truth reads one dump holding both sides
    np.savez(merged, **{**dict(np.load(out[1])), **dict(np.load(out[3]))})
    return out[0], out[2], merged


_RESULTS = {}


def _locate(path, other=None):
    if (path, other) not in _RESULTS:
        _RESULTS[path, other] = tracediff.locate(path, other)
    return _RESULTS[path, other]


def test_correct_port_optimizer_by_role_no_false_positive(runs):
    trace, dump = runs["ok"]
    tr = truth(dump)
    assert _first_beyond(tr) == (None, None)         # the port is right (truth)
    r = _locate(trace)
    assert r.first_parameter is None
    assert [s.step for s in r.optimizer_steps] == sorted(tr)
    for s in r.optimizer_steps:
        assert s.by == "role" and s.beyond == 0 and s.first_beyond is None
        # every 64x64 projection compared transposed by role: the worst tensor agrees as
        # the truth's worst does (was "relative L2 1.41" untransposed); a parameter whose
        # gradient is rounding noise throughout (a key projection's bias: the "ok" case
        # dumps the gradients) is no step's worst while another differs
        z = np.load(dump)
        worst_truth = max(row[1] for row in truth(dump, determined=False)[s.step]
                          if not _noise(z, s.step, row[0]).all())
        assert s.worst_rel_l2 is not None and s.worst_rel_l2 < 1e-5
        assert worst_truth / 3 < s.worst_rel_l2 < worst_truth * 3


def test_correct_port_forward_pairs_layer_norm_not_the_loss_derivative(runs):
    """Under jax.value_and_grad the last LayerNorm pairs at its output, not at the loss
    derivative's 2*h that jvp computes beside it (a false 'max abs 3.38' before)."""
    trace, _ = runs["ok"]
    r = _locate(trace)
    last_ln = [m for m in r.mapping if m["phase"] == "forward"
               and m["b_module"] == "encoder/layer/1/output/LayerNorm"]
    assert last_ln, [m["b_module"] for m in r.mapping]
    with tracediff.load(trace) as t:
        for m in last_ln:
            xa, xb = t.outputs(m["a"])[0], t.outputs(m["b"])[0]
            assert xa.shape == xb.shape
            assert np.linalg.norm(xa - xb) <= RTOL * np.linalg.norm(xb)


def test_correct_port_exit_0(runs):
    """No finding at all: the residual adds of step 1 (their terms cancel, the parameters
    differ by rounding after step 0) and torch's fused attention backward (three grads in
    one op, against JAX's dot_generals) are not divergences."""
    r = _locate(runs["ok"][0])
    assert r.first_beyond_tolerance is None and r.first_parameter is None
    assert r.verdict == "match" and r.exit_code == 0
    assert run_cli("locate", runs["ok"][0]).returncode == 0


@pytest.mark.parametrize("case", ["ok", "ok_eager"])
def test_correct_port_matches_with_backward_and_optimizer_compared(runs, case):
    """SDPA and eager attention (torch's eager attention makes its additive mask from the
    int mask converted to float32, the bytes of the Flax loss's float mask: the scores,
    softmax and context of every layer were left unpaired, INCONCLUSIVE at 26 % of a and
    39 % of b; then torch's `div` scaling the scores' gradient after the softmax backward
    was paired with a `div` inside Flax's softmax transpose: DIVERGED, max abs 1.26e-05).
    A float converted from integers reads the integer atom (`atoms._int_cast`), an atom
    moved from one other atom stands for it in supports (`moved.py`), and a symbol pair
    that would cross a pair where values met is refused (`Reads.crosses`): MATCH, with the
    forward, the backward and both optimizer steps compared."""
    trace, dump = runs[case]
    assert _first_beyond(truth(dump)) == (None, None)      # the port is right (truth)
    r = _locate(trace)
    c = r.coverage
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, c.reasons)
    assert c.sufficient and r.first_parameter is None, c.reasons
    for side in (c.a, c.b):
        assert side.compared >= 0.9 * side.events, side
        for phase in ("forward", "backward"):
            ph = side.by_phase[phase]
            assert ph["events"] > 40 and ph["compared"] >= 0.85 * ph["events"], (phase, side)
        assert side.by_phase["optimizer"]["compared"] == 2, side
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    # inside each layer's attention (the forward) and layer 0's backward: the softmax
    attn = {(m["phase"], m["b_module"]) for m in r.mapping if m["by"] not in ("value", "role")
            and any(w in m["b_op"].rsplit(" + ", 1)[-1] for w in ("softmax", "scaled_dot"))}
    assert {("forward", "encoder/layer/0/attention/self"), ("forward", "encoder/layer/1/attention/self"),
            ("backward", "encoder/layer/0/attention/self")} <= attn, attn


@pytest.mark.parametrize("case", ["mask", "mask_eager"])
def test_decay_mask_names_the_parameter_and_the_step(runs, case):
    trace, dump = runs[case]
    tr = truth(dump)
    step, (name, rel, _, diff, before) = _first_beyond(tr)
    r = _locate(trace)
    p = r.first_parameter
    assert p is not None and r.exit_code == 1
    assert (p.step, p.parameter, p.role) == (step, name, "params")
    assert p.rel_l2 == pytest.approx(rel, rel=0.05)
    # the difference is decoupled weight decay on one side: c * parameter before the step
    c_truth = float(diff.ravel() @ before.ravel() / (before.ravel() @ before.ravel()))
    assert p.upstream_match is True and p.weight_decay is True
    assert p.decay == pytest.approx(c_truth, rel=0.02)
    masked = {n for n, _, beyond, _, _ in tr[step] if beyond}
    assert set(p.decay_parameters) == masked
    assert "a (jax) applies" in p.note and "biases" in p.note and "LayerNorm scales" in p.note
    # the forward of the next step reads the parameters that differ: inherited there
    f = r.first_beyond_tolerance
    assert f is None or (f.a.step > step and f.inputs_match is False)
    # rendered: terminal and JSON
    res = run_cli("locate", trace)
    assert res.returncode == 1
    assert f"first parameter beyond tolerance: step {step}, {name}" in res.stdout
    js = json.loads(run_cli("locate", "--json", trace).stdout)
    assert js["first_parameter"]["parameter"] == name and js["first_parameter"]["step"] == step
    assert js["optimizer_steps"][0]["first_beyond"]["parameter"] == name


def test_decay_mask_two_scripts(two_scripts):
    """The same bug, Flax and torch recorded by two scripts: the same parameter and step."""
    flax_trace, torch_trace, dump = two_scripts
    tr = truth(dump)
    step, (name, rel, _, _, _) = _first_beyond(tr)
    r = _locate(flax_trace, torch_trace)
    p = r.first_parameter
    assert p is not None and r.exit_code == 1
    assert (p.step, p.parameter, p.role) == (step, name, "params")
    assert p.rel_l2 == pytest.approx(rel, rel=0.05) and p.weight_decay is True
    assert set(p.decay_parameters) == {n for n, _, beyond, _, _ in tr[step] if beyond}
