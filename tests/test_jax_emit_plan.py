"""The speed of a JAX recording at --level stats/calls on an accelerator (issue 37) comes
from work made once instead of every step: equation events written from a plan
(capture/jax/probe._Plan), rows whose strings are interned once, optimizer values and a
probe's final outputs taking the words their values program computed (digest_results.Ref),
the probe check answered at the next drain, at level full the small values' bytes kept
as the one buffer they were fetched in. None of it may change the trace: a trace
recorded with these paths equals, table by table, string by string and value by value,
one recorded through the general path. The device path runs here on XLA:CPU
(TRACEDIFF_JAX_DIGEST_ON_DEVICE=1), as on a TPU."""

import importlib.util
import json

import h5py
import numpy as np
import pytest

from .helpers import ROOT, first_difference, xla_cpu_hashes_what_it_returns

# the device path on XLA:CPU (the product hashes on the host there): CI's deep stage,
# which keeps README's test command within its five minutes
pytestmark = pytest.mark.deep

jax = pytest.importorskip("jax")


def _mlp():
    spec = importlib.util.spec_from_file_location("jax_mlp", f"{ROOT}/fixtures/jax_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    return mlp


def _record(out, level, steps, **options):
    """jax_mlp's train step, recorded in this process on the device path; the script's
    final parameters (what it would print)."""
    import tracediff

    with tracediff.record(out, level=level, jax_values="compiled", hash="words64",
                          frameworks=("jax",), **options):
        step, params, state = _mlp().build((8, 16, 16, 4), 4)
        step = jax.jit(step)
        for _ in range(steps):
            params, state, loss = step(params, state)
        final = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)] + [np.asarray(loss)]
    return final


def _manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f["manifest"][()])["frameworks"]["jax"]


@pytest.mark.parametrize("level", ["stats", "calls", "full"])
def test_planned_events_write_the_trace_the_general_path_writes(tmp_path, monkeypatch, level):
    """Flushes every 64 rows (inside and between planned calls), never by the clock (the
    host reduces small values' statistics in batches whose makeup would follow it)."""
    from tracediff.capture.jax import probe
    from tracediff.trace.writer import settings

    monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", "1")
    monkeypatch.setattr(settings, "FLUSH_ROWS", 64)
    monkeypatch.setattr(settings, "FLUSH_SECONDS", 1e9)
    finals = {}
    for name, planned in (("general", False), ("planned", True)):
        monkeypatch.setattr(probe, "_PLANS_ON", planned)
        finals[name] = _record(tmp_path / f"{name}.h5", level, 5)
    assert all(np.array_equal(a, b) for a, b in zip(finals["general"], finals["planned"]))
    # by value: a planned call at full keeps its joined values as the one buffer they
    # came back in, where the general path copies them one by one
    assert first_difference(tmp_path / "general.h5", tmp_path / "planned.h5",
                            by_value=True) is None
    mg, mp = _manifest(tmp_path / "general.h5"), _manifest(tmp_path / "planned.h5")
    assert mp["digests_on_device"]["values"] > 0
    if level != "calls":
        cv = mp["compiled_values"]
        assert cv == mg["compiled_values"] and cv["equations"] > 100
        # every call's values program computed what the script's program did (XLA:CPU),
        # each answered by the two sides' hashes at a drain; not where this CPU's XLA code
        # rounds two fusions of one value apart (then the manifest counts the calls that
        # differ, as it should)
        if not xla_cpu_hashes_what_it_returns():
            assert cv["final_outputs_equal_compiled"] == cv["calls"] > 5
            assert cv["final_outputs_differ_from_compiled"] == 0


def test_a_train_step_runs_two_programs_besides_its_own(tmp_path, monkeypatch):
    """Per call at --level stats: the values program (its equations, the optimizer
    step's values, its final outputs) and one batch for the compiled outputs; before, a
    batch for the probe call's outputs and tagged values, a batch for the optimizer
    step's values and a comparison program ran besides (a dispatch each, and the
    parameters hashed four times)."""
    monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", "1")
    batches = {}
    for steps in (3, 6):
        _record(tmp_path / f"s{steps}.h5", "stats", steps)
        batches[steps] = _manifest(tmp_path / f"s{steps}.h5")["digests_on_device"]["batches"]
    assert (batches[6] - batches[3]) == 2 * 3


def test_compare_later_answers_by_hash_at_the_drain(tmp_path):
    """Two values compared by the words64 hashes their programs made: equal bytes
    compare equal, one differing element unequal, answered only when the results are
    read (no host sync inside the call)."""
    import jax.numpy as jnp

    from tracediff.capture.jax import device_digests, program_cache
    from tracediff.trace.writer import TraceWriter

    w = TraceWriter(str(tmp_path / "t.h5"), {})
    w.level = "stats"
    assert w.use_hash("words64")
    d = device_digests.DeviceDigests(w, __import__("contextlib").nullcontext,
                                     program_cache.ProgramCache())
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    y = x.at[1, 2].set(7.5)
    with d.outputs():
        refs = [d.add(0, slot, v, 0, None) for slot, v in enumerate((x, x + 0, y))]
    got = []
    d.compare_later([refs[0]], [refs[1]], got.append)
    d.compare_later([refs[0]], [refs[2]], got.append)
    assert got == []
    d.drain()
    assert got == [True, False]
    w.close()
