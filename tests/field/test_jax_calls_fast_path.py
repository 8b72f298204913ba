"""`--level calls` records the script's jitted functions around JAX's C++ fast path
(capture/jax/fastjit.py). On programs written as users write them, the trace must be the
one every call through the hook writes (TRACEDIFF_JAX_FAST_JIT=0, the path recorded so far),
row by row, and the script's printed results those of a plain run: Flax NNX training
under `nnx.jit` with `nnx.Optimizer` and a jit with a static flag, data-parallel training
over 8 simulated devices with `NamedSharding`, the GRU + expm + Adam seed's example,
`lax.scan`/`cond` control flow, and `pmap`/`shard_map` programs (no fast-path calls: the
hook records them all)."""

import json
import os

import h5py
import pytest

from ..helpers import ROOT, first_difference, record, run_plain

pytest.importorskip("jax")
pytestmark = pytest.mark.field

PROGRAMS = {   # program -> calls the fast path records (the others: the hook)
    "tests/field/programs/nnx_train.py": 6,        # 5 nnx.jit steps, predict
    "fixtures/jax_sharded_dp.py": 2,
    "tracediff/examples/jax_gru_expm_adam.py": 3,
    "fixtures/jax_control_flow.py": 1,
    "fixtures/jax_pmap.py": 0,
    "fixtures/jax_shard_map_pmean.py": 0,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_calls_on_the_fast_path_match_the_hook(tmp_path, program):
    path = os.path.join(ROOT, program)
    plain = run_plain(path)
    traces = {}
    for name, flag in (("hook", "0"), ("fast", "1")):
        out = tmp_path / f"{name}.h5"
        proc = record(path, out, env={"TRACEDIFF_JAX_FAST_JIT": flag}, extra=("--level", "calls"))
        assert proc.stdout == plain.stdout, proc.stderr[-2000:]
        traces[name] = out
    assert first_difference(traces["hook"], traces["fast"]) is None
    with h5py.File(traces["fast"], "r") as f:
        jx = json.loads(f["manifest"][()])["frameworks"]["jax"]
    assert (jx.get("calls_on_fast_path") or {}).get("calls", 0) == PROGRAMS[program]
