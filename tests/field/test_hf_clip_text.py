"""HF transformers' CLIPTextModel against its FlaxCLIPTextModel port (tests/field/programs/
hf_clip_text.py), written as CLIP's documentation calls them: the Flax model given
`position_ids` of the batch's shape, torch reading its own [1, n] buffer.

Before coverage, `locate` said MATCH ("every compared value is bitwise identical", exit 0)
for the correct port and for every injected bug, having paired 3 of the torch side's ~50
computing units. The truth is computed here, independently of tracediff (torch forward
hooks and Flax `capture_intermediates`, paired by module path). Whatever the pairing
manages, tracediff must never say MATCH where the truth differs, never DIVERGED on the
correct port, and a MATCH must carry sufficient coverage.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_clip_text.py")
RTOL, ATOL = 1e-5, 1e-6
CASES = {"correct": "none", "gelu": "gelu", "eps": "eps"}


def _program():
    spec = importlib.util.spec_from_file_location("hf_clip_text_program", PROGRAM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_clip")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    out = {}
    for name, bug in CASES.items():
        path = str(d / f"{name}.h5")
        r = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", path, PROGRAM,
                            "--bug", bug], cwd=d, env=env, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        out[name] = path
    return out


def _first(x):
    while isinstance(x, (tuple, list)) or hasattr(x, "to_tuple"):
        x = x.to_tuple()[0] if hasattr(x, "to_tuple") else x[0]
    return np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float64)


def truth(bug):
    """The first module (in the order torch's modules finish) whose output differs beyond
    float32 tolerance between the two models, or None; and how many modules compared."""
    import jax
    import torch
    prog = _program()
    ids = prog.batch()
    tmodel, state = prog.torch_model("eager")
    outs, order = {}, []

    def hook(name):
        def fn(_m, _i, output):
            outs[name] = _first(output)
            order.append(name)
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in tmodel.named_modules() if n]
    with torch.no_grad():
        tmodel(input_ids=torch.from_numpy(ids))
    for h in handles:
        h.remove()
    fmodel, params = prog.flax_model(state, bug)
    pos = prog.flax_positions(ids, "batch", bug)
    _, inter = fmodel.module.apply({"params": params}, ids.astype(np.int32),
                                   np.ones_like(ids, np.int32), pos,
                                   capture_intermediates=True, mutable=["intermediates"])
    flat = {}
    for path, v in jax.tree_util.tree_flatten_with_path(
            inter["intermediates"], is_leaf=lambda x: isinstance(x, tuple))[0]:
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if keys and keys[-1] == "__call__":
            flat[".".join(str(k) for k in keys[:-1])] = _first(v)
    compared, first = 0, None
    for name in order:
        a, b = flat.get(name), outs[name]
        if a is None or a.size != b.size:
            continue
        compared += 1
        if first is None and (np.abs(a.reshape(b.shape) - b) > ATOL + RTOL * np.abs(b)).any():
            first = name
    return first, compared


def test_correct_port_is_never_diverged_and_never_a_thin_match(traces):
    first, compared = truth("none")
    assert first is None and compared > 10          # the truth: every module agrees
    r = tracediff.locate(traces["correct"], explain=False)
    assert r.verdict in ("match", "inconclusive"), r.first_beyond_tolerance
    assert r.verdict != "match" or r.coverage.sufficient
    if r.verdict == "inconclusive":
        assert r.exit_code == 3 and r.coverage.reasons and r.coverage.next_step


@pytest.mark.parametrize("case", ["gelu", "eps"])
def test_a_port_bug_is_never_a_match(traces, case):
    first, _ = truth(CASES[case])
    assert first is not None                        # the truth: the port differs
    r = tracediff.locate(traces[case], explain=False)
    assert r.verdict != "match", (first, r.coverage)
    if r.verdict == "diverged":                     # then at the truth's module
        mod = r.first_beyond_tolerance.layer["module"]
        assert mod["b"].replace("/", ".").startswith(first.rsplit(".", 1)[0]), (mod, first)
    else:
        assert r.verdict == "inconclusive" and not r.coverage.sufficient
