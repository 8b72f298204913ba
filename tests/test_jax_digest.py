"""words64 (trace/values.py): the hash XLA computes on the device (capture/jax/digest_programs.py)
is the hash numpy computes on the host, and equal hashes stand for equal bytes; a JAX
recording that hashes on the device writes the trace the host path writes; calls holding
float64/complex128 replayed on the host CPU (capture/jax/host_replay.py) leave the script's
ending as it is. The device code paths run here on XLA:CPU (TRACEDIFF_JAX_DIGEST_ON_DEVICE,
TRACEDIFF_JAX_WIDE_ON_HOST), as on a TPU."""

import itertools
import json
import textwrap

import h5py
import numpy as np
import pytest

from tracediff.trace import schema, values
from tracediff.trace.reader import Trace

from .helpers import record, script_env, xla_cpu_hashes_what_it_returns
from .stats_truth import assert_float64_truth, float32_tolerances, hostile_values

# the device path on XLA:CPU (the product hashes on the host there): CI's deep stage,
# which keeps README's test command within its five minutes
pytestmark = pytest.mark.deep

jax = pytest.importorskip("jax")


def _device_hashes(arrays):
    """words64 of each array computed by the device programs (digest_programs) on XLA:CPU: the
    hash alone (level full), and with the statistics reduced in the same pass (an
    accelerator's) or beside it (XLA:CPU's); the three agree."""
    from tracediff.capture.jax import digest_programs, digest_results

    found = []
    for fn in (lambda xs: digest_programs.packed(xs, False),
               lambda xs: digest_programs.packed(xs, True, together=True),
               lambda xs: digest_programs.packed(xs, True, together=False)):
        out = np.asarray(jax.jit(fn)([jax.numpy.asarray(a) for a in arrays]))
        a, b, _, _ = digest_results.unpack_all(out, out.size > 2 * len(arrays))
        found.append([values.words_finish(p, q, np.asarray(x).nbytes)
                      for p, q, x in zip(a, b, arrays)])
    assert found[0] == found[1] == found[2]
    return found[0]


def test_words64_on_the_device_equals_the_host():
    import ml_dtypes

    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((3, 5)).astype(np.float32),
             rng.standard_normal(5).astype(ml_dtypes.bfloat16),
             rng.standard_normal(3).astype(np.float16),
             rng.integers(0, 255, 7).astype(np.uint8), rng.integers(-9, 9, 5).astype(np.int8),
             np.array([True, False, True]),
             (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
             np.float32(3.0), np.zeros(0, np.float32), rng.integers(0, 9, (2, 3)).astype(np.int32),
             # across the host path's chunks of 64K words, and a partial last word
             rng.standard_normal((2 << 16) + 5).astype(np.float32),
             rng.integers(0, 255, (4 << 16) + 3).astype(np.uint8),
             # hashed in place as (rows, last axis): 3-D, one column, one row, empty
             rng.standard_normal((2, 3, 4)).astype(np.float32),
             rng.integers(0, 9, (5, 1)).astype(np.uint32), np.float32([[1, 2, 3]]),
             np.zeros((0, 3), np.float32)]
    for case, h in zip(cases, _device_hashes(cases)):
        assert h == values.words_digest(values.prepare(case)[0]), (case.dtype, case.shape)


def test_device_statistics_follow_the_hosts_definitions():
    """min, max, mean over the finite numbers (min/max over the non-NaN ones), L2 of the
    finite ones, NaN and Inf counts: computed on the device by the finite-only reductions
    when every number of the batch is finite, else by the masked ones for the whole batch
    (inside a values program: the masked ones), in one pass or apart; all equal the host's statistics (float32
    accumulation: within rounding)."""
    from tracediff.capture.jax import digest_programs, digest_results

    rng = np.random.default_rng(1)
    finite = [rng.standard_normal((4, 6)).astype(np.float32), np.arange(7, dtype=np.int32),
              np.array([True, False, True]), np.float32(-2.5),
              (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
              np.zeros(0, np.float32)]
    odd = [np.float32([1, np.nan, -3]), np.float32([np.inf, 2, -np.inf, np.nan]),
           np.float32([np.nan, np.nan]), np.float32([np.inf, 1])]
    for inside, together in itertools.product((False, True), (False, True)):
        # a batch of a call's outputs, or a values program's own; one pass (an
        # accelerator) or float reductions apart (XLA:CPU)
        fn = jax.jit(lambda xs: digest_programs.packed(xs, True, inside=inside, together=together))
        for batch in (finite, finite + odd, odd):
            _, _, st, counts = digest_results.unpack_all(
                np.asarray(fn([jax.numpy.asarray(a) for a in batch])), True)
            for a, got in zip(batch, np.concatenate([st, counts], axis=1)):
                want = values.value_stats(np.asarray(a))
                assert np.allclose(got, want, rtol=1e-6, equal_nan=True), \
                    (inside, together, a, got)


def test_device_statistics_stay_within_locates_rounding_allowance():
    """A large value's mean and L2, summed on the device in float32 in one pass or apart,
    stay within the rounding locate allows for when it bounds a difference by them
    (diff/compare/levels.py: 1e-6 * RMS * log2 n for the mean, eps * sqrt n more for the
    L2 over sqrt n): otherwise two equal values read as different. XLA:CPU accumulates a
    variadic reduction in one sequential chain, the worst order there is: the one-pass
    form reduces rows first, then columns."""
    import math

    from tracediff.capture.jax import digest_programs, digest_results

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2048, 1024)) + 3.0).astype(np.float32)
    exact = x.astype(np.float64)
    n = x.size
    mean, l2 = exact.mean(), math.sqrt((exact * exact).sum())
    rms = l2 / math.sqrt(n)
    slack = 1e-6 * rms * math.log2(n)
    for inside, together in itertools.product((False, True), (False, True)):
        fn = jax.jit(lambda xs: digest_programs.packed(xs, True, inside=inside, together=together))
        _, _, st, _ = digest_results.unpack_all(np.asarray(fn([jax.numpy.asarray(x)])), True)
        got_mean, got_l2 = st[0, 2:4]
        assert abs(got_mean - mean) <= slack, (inside, together, got_mean, mean)
        assert abs(got_l2 - l2) / math.sqrt(n) <= slack + rms * 2.0 ** -23 * math.sqrt(n), \
            (inside, together, got_l2, l2)


def test_device_statistics_of_tiny_and_huge_values_are_float64s():
    """The device sums a value's numbers and their squares in float32, where squares
    underflow below ~1e-19 (Adam's `exp_avg_sq`, at most ~1e-28: L2 0.0) and overflow
    above ~1.8e19, and XLA:CPU and a TPU flush subnormals to 0. Values of every dtype
    digested there (float16, bfloat16, float32; 1-D and as rows), tiny, subnormal, huge,
    near the dtype's max and mixed, get float64's mean and L2 (within the rounding of
    float32 sums) from every form of the program: a call's outputs (finite-only
    reductions or masked ones, in one pass or apart) and a values program's own; min and
    max are exact but where the device compares a subnormal as 0."""
    from tracediff.capture.jax import digest_programs, digest_results

    kinds = ("tiny", "subnormal", "huge", "near_max", "mixed")
    cases = [(what, x) for what, x in hostile_values(kinds, np.random.default_rng(6))
             if digest_results.dtype_ok(x.dtype)]
    cases += [(what + " as rows", x.reshape(-1, 4)) for what, x in cases]
    for inside, together in itertools.product((False, True), (False, True)):
        fn = jax.jit(lambda xs: digest_programs.packed(xs, True, inside=inside, together=together))
        out = np.asarray(fn([jax.numpy.asarray(x) for _, x in cases]))
        _, _, st, _ = digest_results.unpack_all(out, True)
        for (what, x), row in zip(cases, st):
            lo, hi = x.astype(np.float64).min(), x.astype(np.float64).max()
            if min(abs(lo), abs(hi)) >= np.finfo(np.float32).tiny:   # else compared as 0
                assert row[0] == lo and row[1] == hi, (what, row[:2])
            tol = float32_tolerances(x.size, chain=together and x.ndim == 1)
            assert_float64_truth(row[2], row[3], x, f"{what}, inside={inside}, "
                                 f"together={together}", tol)


def test_words64_equal_hash_means_equal_bytes():
    """Every single-bit change of a float32 value (a one-word difference: always detected
    by construction), every swap of two elements, and a trailing zero byte give distinct
    hashes, on the device as on the host."""
    base = np.linspace(-1, 1, 16, dtype=np.float32)
    variants = [base]
    for i in range(base.size):
        for bit in range(32):
            v = base.copy()
            v.view(np.uint32)[i] ^= np.uint32(1 << bit)
            variants.append(v)
    for i in range(base.size):
        for j in range(i + 1, base.size):
            v = base.copy()
            v[[i, j]] = v[[j, i]]
            variants.append(v)
    host = [values.words_digest(v) for v in variants]
    assert len(set(host)) == len({v.tobytes() for v in variants}) == len(variants)
    assert _device_hashes(variants[:40]) == host[:40]
    assert values.words_digest(np.uint8([1, 2, 3])) != values.words_digest(np.uint8([1, 2, 3, 0]))


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    @jax.jit
    def wide(x):                 # float64 -> complex128: replayed on the host CPU
        return jnp.abs((x * 2).astype(jnp.complex128) * 1j).sum()

    @jax.jit
    def narrow(w, x):            # float32, bfloat16, int8: hashed on the device
        y = jnp.tanh(x @ w)
        return y, y.astype(jnp.bfloat16), (y > 0).astype(jnp.int8)

    w = jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(4, 3)
    x = jnp.ones((2, 4), jnp.float32)
    for _ in range(2):
        y, b, s = narrow(w, x)
    print("wide", float(wide(jnp.arange(5.0))), "narrow", float(y.sum()))
    raise ValueError("the script's own ending")
""")


def _manifest(path):
    with h5py.File(path, "r") as f:
        return json.loads(f["manifest"][()])


def test_device_hashing_and_host_replay_change_neither_trace_nor_ending(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "wide_narrow.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, str(script)], env=script_env(), capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 1 and "the script's own ending" in plain.stderr
    on_device = {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1", "TRACEDIFF_JAX_WIDE_ON_HOST": "1"}
    on_host = {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "0", "TRACEDIFF_JAX_WIDE_ON_HOST": "0"}
    traces = {}
    for name, env in (("device", on_device), ("host", on_host)):
        out = tmp_path / f"{name}.h5"
        proc = record(str(script), out, env=env, extra=("--level", "stats", "--hash", "words64"),
                      check=False)
        assert proc.returncode == plain.returncode, proc.stderr[-2000:]
        assert proc.stdout == plain.stdout
        assert "ValueError: the script's own ending" in proc.stderr
        traces[name] = out
    md, mh = _manifest(traces["device"]), _manifest(traces["host"])
    assert md["recording"]["hash"] == mh["recording"]["hash"] == "words64"
    jd = md["frameworks"]["jax"]
    assert jd["digests_on_device"]["values"] > 0
    assert jd["replayed_on_host_cpu"]["calls"] >= 1 and not jd["replay_errors"]
    assert mh["frameworks"]["jax"]["replayed_on_host_cpu"]["calls"] == 0
    with h5py.File(traces["device"], "r") as fd, h5py.File(traces["host"], "r") as fh:
        vd, vh = fd["values"][:], fh["values"][:]
        assert len(vd) == len(vh)
        assert (vd["hash"] == vh["hash"]).all()
        assert (vd["flags"] == vh["flags"]).all()
        sd, sh = np.sort(fd["stats"][:], order="value"), np.sort(fh["stats"][:], order="value")
        assert (sd["value"] == sh["value"]).all()   # rows filled later, in another order
        for field in ("min", "max"):
            assert np.allclose(sd[field], sh[field], equal_nan=True)


TRAIN = textwrap.dedent("""
    import jax, jax.numpy as jnp, optax
    opt = optax.adam(1e-2)

    @jax.jit
    def step(params, state, x):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.sum(jnp.tanh(x @ p["w"] + p["b"]) ** 2))(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, (loss > 0).astype(jnp.int8)

    params = {"w": jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(4, 3),
              "b": jnp.zeros(3, jnp.bfloat16).astype(jnp.float32)}
    state = opt.init(params)
    x = jnp.ones((2, 4), jnp.float32)
    for _ in range(4):
        params, state, loss, flag = step(params, state, x)
    print(float(loss), int(flag))
""")


def _device_and_host(tmp_path, text, *options):
    """{"device": trace, "host": trace} of one script recorded with words64 hashes
    computed on the device (XLA:CPU here) and on the host."""
    script = tmp_path / "script.py"
    script.write_text(text)
    traces = {}
    for name, flag in (("device", "1"), ("host", "0")):
        out = tmp_path / f"{name}.h5"
        record(str(script), out, env={"TRACEDIFF_JAX_DIGEST_ON_DEVICE": flag},
               extra=(*options, "--hash", "words64"))
        traces[name] = out
    return traces


def test_calls_hashed_on_the_device_write_the_hosts_rows(tmp_path):
    """At --level calls a jitted step's rows are made once per signature and its outputs
    hashed on the device by one program (`_LightPlan`, `DeviceDigests.add_rows`): the
    trace holds the rows the host path writes value by value (names, dtypes, shapes,
    flags, hashes; statistics within float32 rounding), and a later step's arguments
    (outputs of the step before, known by name, dtype and shape only) say what those
    outputs were."""
    from .helpers import trace_rows

    traces = _device_and_host(tmp_path, TRAIN, "--level", "calls")
    assert _manifest(traces["device"])["frameworks"]["jax"]["digests_on_device"]["values"] > 0
    rows, host = trace_rows(traces["device"]), trace_rows(traces["host"])
    for table in rows:
        if table != "stats":
            assert rows[table] == host[table], table
    assert len(rows["stats"]) == len(host["stats"]) > 0
    for a, b in zip(rows["stats"], host["stats"]):   # value, min, max, mean, l2, nan, inf
        scale = max(abs(a[1]), abs(a[2]), 1e-30)
        assert a[:3] == b[:3] and a[5:] == b[5:]
        assert np.allclose(a[3:5], b[3:5], rtol=1e-6, atol=1e-6 * scale), (a, b)
    with h5py.File(traces["device"], "r") as f:
        fields = f["values"].dtype.names
    vals = [dict(zip(fields, r)) for r in rows["values"]]
    by_slot = {(v["event"], v["role"], v["slot"]): v for v in vals}
    inputs = [r for r in rows["inputs"] if r[2] >= 0]   # (event, slot, producer, slot)
    assert len(inputs) == 3 * 7    # steps 2-4: params (2), Adam state (5), from the step before
    for event, slot, producer, pslot in inputs:
        arg = by_slot[(event, schema.ROLE_IN, slot)]
        made = by_slot[(producer, schema.ROLE_OUT, pslot)]
        assert (arg["dtype"], arg["shape"]) == (made["dtype"], made["shape"])
        assert arg["flags"] & schema.VFLAG_NOT_STORED and arg["name"]


CAN_DIGEST = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from tracediff.capture.jax import digest_results
    mesh = jax.make_mesh((2,), ("d",))
    x = jnp.arange(8.0, dtype=jnp.float32)
    spread = jax.device_put(x, NamedSharding(mesh, P("d")))
    print(digest_results.can_digest(x), digest_results.can_digest(spread))
""")


def test_what_is_hashed_on_the_device():
    """Real (bfloat16 and float8 too), integer, bool and complex64 values of at most
    4-byte parts, committed to one device; 64-bit values (emulated on a TPU) and a global
    array over several devices (the host path records its shards) are not."""
    import subprocess
    import sys

    from tracediff.capture.jax import digest_results

    import ml_dtypes

    # bfloat16 and float8 are numpy kind "V": they were sent to the host path by mistake
    for dt in (np.float32, np.float16, np.int8, np.uint8, np.int32,
               np.bool_, np.complex64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        assert digest_results.dtype_ok(dt), dt
    for dt in (np.float64, np.int64, np.uint64, np.complex128):
        assert not digest_results.dtype_ok(dt), dt
    env = script_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                      "JAX_PLATFORMS": "cpu"})
    proc = subprocess.run([sys.executable, "-c", CAN_DIGEST], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False"]


def test_flushes_inside_a_values_program_keep_every_hash(tmp_path, monkeypatch):
    """A values program's rows are reserved while its equations' events are written and
    filled from its packed result afterwards; an automatic flush in between (due by time in
    a long run, by rows here) wrote them unfilled and the fill hit a stale handle
    (IndexError inside the script's own jit call, 200 steps of fixtures/jax_mlp.py). With a
    flush due every 8 rows, the device trace is the host trace, hash by hash."""
    import importlib.util

    import tracediff
    from tracediff.trace.writer import settings

    from .helpers import ROOT

    spec = importlib.util.spec_from_file_location("jax_mlp", f"{ROOT}/fixtures/jax_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    monkeypatch.setattr(settings, "FLUSH_ROWS", 8)
    traces = {}
    for name, device in (("device", "1"), ("host", "0")):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        out = traces[name] = tmp_path / f"{name}.h5"
        with tracediff.record(out, level="stats", jax_values="compiled", hash="words64",
                              frameworks=("jax",)):
            step, params, state = mlp.build((8, 16, 4), 4)
            step = jax.jit(step)
            for _ in range(3):
                params, state, _ = step(params, state)
    assert _manifest(traces["device"])["frameworks"]["jax"]["digests_on_device"]["values"] > 0
    with h5py.File(traces["device"], "r") as fd, h5py.File(traces["host"], "r") as fh:
        assert fd.attrs["committed_events"] == fh.attrs["committed_events"] > 100
        vd, vh = fd["values"][:], fh["values"][:]
        assert len(vd) == len(vh) > 100
        assert (vd["hash"] == vh["hash"]).all() and (vd["flags"] == vh["flags"]).all()


FULL_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, optax

    @jax.jit
    def step(w, s, x):           # float32, bfloat16, bool, int32, uint8, complex64 values
        def loss(w):
            y = jnp.tanh(x @ w)
            return (y * y).mean()
        l, g = jax.value_and_grad(loss)(w)
        u, s = opt.update(g, s, w)
        y = x @ w
        extra = (y.astype(jnp.bfloat16) * 3, y > 0, jnp.argmax(y, axis=1),
                 (y * 100).astype(jnp.uint8), jax.lax.complex(y, -y),
                 jnp.tile(y, (1, 200)) * 2)   # 1.2 MB: past the joined buffer's 1 MB
        return optax.apply_updates(w, u), s, l, extra

    opt = optax.adam(1e-2)
    w = jnp.linspace(-1, 1, 4 * 515, dtype=jnp.float32).reshape(4, 515)
    x = jnp.ones((3, 4), jnp.float32)
    s = opt.init(w)
    for _ in range(3):
        w, s, l, extra = step(w, s, x)
    print("loss", float(l), "sum", float(w.sum()))
""")


def test_full_level_on_the_device_stores_the_bytes_it_hashed(tmp_path):
    """At --level full with values hashed on the device, a values program's values come
    back batched (the small ones joined in one buffer a call) and their hashes are those
    of the returned bytes: every stored value's words64 is its row's hash (hashed inside
    the values program without an optimization barrier, XLA:CPU once recomputed an `add`
    in the hashing fusion with another rounding), of every dtype, with as many rows as the
    host path writes."""
    from tracediff.trace.reader import Trace

    why = xla_cpu_hashes_what_it_returns()
    if why:
        pytest.skip(why)
    traces = _device_and_host(tmp_path, FULL_SCRIPT, "--level", "full", "--jax-values",
                              "compiled")
    jd = _manifest(traces["device"])["frameworks"]["jax"]
    assert jd["digests_on_device"]["values"] > 50
    with h5py.File(traces["device"], "r") as fd, h5py.File(traces["host"], "r") as fh:
        vd, vh = fd["values"][:], fh["values"][:]
    assert len(vd) == len(vh)
    assert (vd["flags"] == vh["flags"]).all()
    stored, dtypes, big = 0, set(), 0
    with Trace(str(traces["device"])) as td:
        for row in vd:
            a = td.read_value(row)
            if a is None:
                continue
            assert values.words_digest(values.prepare(a)[0]) == int(row["hash"]), \
                (td.event(int(row["event"]))["op"], a.dtype, a.shape)
            stored += 1
            dtypes.add(str(a.dtype))
            big += a.nbytes > 1 << 20
    assert stored > 50 and big
    assert {"float32", "bfloat16", "bool", "int32", "uint8", "complex64"} <= dtypes


def test_a_device_program_that_fails_at_level_full_leaves_the_host_to_hash(tmp_path,
                                                                          monkeypatch):
    """Where the device cannot run the program that hashes and joins a call's outputs (a
    program one backend rejects), the call still returns and its values are hashed on the
    host: the same results, every stored value's words64 its row's hash."""
    import tracediff
    from tracediff.capture.jax import device_digests
    from tracediff.trace.reader import Trace

    def refuse(self, xs, copy=True):
        raise RuntimeError("UNIMPLEMENTED: this backend refuses the program")

    monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", "1")
    monkeypatch.setattr(device_digests.DeviceDigests, "fetch", refuse)
    f = jax.jit(lambda w, x: (jax.numpy.tanh(x @ w), (x @ w) > 0))
    w, x = jax.numpy.ones((4, 3)), jax.numpy.linspace(-1, 1, 8).reshape(2, 4)
    want = [np.asarray(v) for v in f(w, x)]
    out = tmp_path / "refused.h5"
    with tracediff.record(out, level="full", hash="words64", frameworks=("jax",)):
        got = [np.asarray(v) for v in f(w, x)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
    with h5py.File(out, "r") as fh:
        rows = fh["values"][:]
    stored = 0
    with Trace(str(out)) as t:
        for row in rows:
            a = t.read_value(row)
            if a is not None:
                assert values.words_digest(values.prepare(a)[0]) == int(row["hash"])
                stored += 1
    assert stored >= 2


def _call_and_probe_outputs(path):
    """{"jit": rows, "probe": rows}: (slot, offset, nbytes, hash, bytes) of each output row
    of the last jitted call and of its values program's event."""
    from tracediff.trace.reader import Trace

    out = {}
    with h5py.File(path, "r") as f:
        strings = [s.decode() if isinstance(s, bytes) else s for s in f["strings"][:]]
        ops = [strings[i] for i in f["events"]["op"][:]]
        rows = f["values"][:]
    with Trace(str(path)) as t:
        for key in ("jit", "probe"):
            eid = max(i for i, op in enumerate(ops) if op.startswith(key + ":"))
            out[key] = [(int(r["slot"]), int(r["offset"]), int(r["nbytes"]), int(r["hash"]),
                         t.read_value(r).tobytes()) for r in rows
                        if r["event"] == eid and r["role"] == schema.ROLE_OUT]
    return out


@pytest.mark.parametrize("width", [3, 300_000])   # outputs joined, and each its own copy
@pytest.mark.parametrize("perturbed", [False, True])
def test_a_calls_outputs_share_its_values_programs_bytes_only_where_equal(
        tmp_path, monkeypatch, perturbed, width):
    """At level full a jitted call's outputs are hashed on the device, and in the steady
    state (a call whose rows are planned: the third here) where the hash, dtype and shape
    equal its values program's final output's, the call's row points at the bytes the
    trace holds for that output (held once, their copy never started);
    where the values program computed something else (one op perturbed in it, as a
    compiler's other rounding would), the call's rows hold the call's own bytes, and the
    manifest counts the difference. Outputs small enough to come back joined, and outputs
    each copied on its own."""
    import tracediff
    from tracediff.capture.jax import digest_results, recorder

    monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", "1")
    if perturbed:
        bind = recorder.JaxCapture.bind

        def nudged(eqn, vals):
            outs = bind(eqn, vals)
            return [o + 1 for o in outs] if eqn.primitive.name == "sin" else outs

        monkeypatch.setattr(recorder.JaxCapture, "bind", staticmethod(nudged))
    f = jax.jit(lambda w, x: (jax.numpy.tanh(x @ w), jax.numpy.sin(x @ w)))
    w, x = jax.numpy.ones((4, width)), jax.numpy.linspace(-1, 1, 8).reshape(2, 4)
    want = [np.asarray(v).tobytes() for v in f(w, x)]
    assert (len(want[0]) > digest_results.JOIN_VALUE) == (width > 3)
    out = tmp_path / "call.h5"
    with tracediff.record(out, level="full", hash="words64", frameworks=("jax",),
                          jax_values="compiled"):
        for _ in range(3):
            got = [np.asarray(v).tobytes() for v in f(w, x)]
            assert got == want
    rows = _call_and_probe_outputs(out)
    call, probe = rows["jit"], rows["probe"]
    assert [r[4] for r in call] == want   # the call's rows: the call's values, always
    assert [r[3] for r in call] == [values.words_digest(np.frombuffer(b, np.float32))
                                    for b in want]
    probe_info = _manifest(out)["frameworks"]["jax"]["compiled_values"]
    if perturbed:   # sin's output differs: its own bytes; tanh's still shared
        assert probe_info["differing_calls"] and not probe_info["final_outputs_equal_compiled"]
        assert call[0][1] == probe[0][1] and call[1][1] != probe[1][1]
        assert probe[1][4] != want[1]
    else:
        assert probe_info["final_outputs_equal_compiled"] == 3
        assert [r[1] for r in call] == [r[1] for r in probe]


def test_the_joined_buffer_holds_each_value_at_its_start_stacked_or_not():
    """`join` groups the small values by shape and dtype (stacked where their bytes are
    whole words: one relayout a shape); every value's bytes sit at its `joined_starts`
    offset, the same buffer stacked or value by value, odd-sized bfloat16, bool and
    complex too, and the same as the host makes while the join's program compiles."""
    from tracediff.capture.jax import digest_groups, digest_programs, digest_results

    jnp = jax.numpy
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 4)).astype(np.float32), np.arange(5, dtype=np.int32),
          rng.standard_normal((3, 4)).astype(np.float32),
          jnp.asarray(rng.standard_normal(3), jnp.bfloat16), np.array([True, False, True]),
          jnp.asarray(rng.standard_normal(3), jnp.bfloat16), np.float32(2.5),
          rng.standard_normal((3, 4)).astype(np.float32), jnp.asarray(rng.standard_normal((2, 2)),
                                                                      jnp.bfloat16),
          np.array([1 + 2j, -3.5j], np.complex64)]
    xs = [jnp.asarray(x) for x in xs]
    avals = [(x.shape, x.dtype) for x in xs]
    small = [True] * len(xs)
    small[1] = False
    starts = digest_results.joined_starts(avals, small)
    assert starts[1] is None
    picked = [x for x, j in zip(xs, small) if j]
    flats = [np.asarray(jax.jit(lambda *a, s=s: digest_programs.join(list(a), stack=s))(*picked))
             for s in (False, True)]
    assert flats[0].tobytes() == flats[1].tobytes()
    assert digest_groups.host_join(picked).tobytes() == flats[0].tobytes()
    # joined in pieces of whole groups (programs compiled side by side), end to end
    pieces = digest_results.join_pieces([(x.shape, x.dtype) for x in picked], 3)
    assert len(pieces) == 3 and sorted(i for p in pieces for i in p) == list(range(len(picked)))
    ends = [np.asarray(jax.jit(lambda *a: digest_programs.join(list(a), stack=True))(
        *[picked[i] for i in p])) for p in pieces]
    assert digest_results.Joined(ends)().tobytes() == flats[0].view(np.uint8).tobytes()
    data = flats[1].view(np.uint8)
    assert starts[2] == starts[0] + 48   # the two (3, 4) float32 values side by side
    for x, at in zip(xs, starts):
        if at is not None:
            got = digest_results.view_at(data, at, x.dtype, x.shape)
            assert got.tobytes() == np.asarray(x).tobytes()


def test_the_device_paths_hash_is_never_zero_as_the_hosts_is_not():
    """A hash of 0 means "no hash" (a metadata-only value, docs/format.md): words64 maps
    the one mix that would finish as 0 to 1, on the host (`values.words_finish`) and on the
    device path's batched finish (`digest_results.finish_all`, the zero-hash fix), so a value
    hashed on the device never reads as metadata-only nor differs from the host's hash.
    fmix64(0) is 0: lanes equal to the byte count's term finish as 0 before the fix."""
    from tracediff.capture.jax import digest_results

    nbytes = np.array([4, 64, 1 << 20], np.uint64)
    with np.errstate(over="ignore"):
        term = nbytes * np.uint64(0x9E3779B97F4A7C15)
    lane1, lane2 = term >> np.uint64(32), term & np.uint64(0xFFFFFFFF)
    got = digest_results.finish_all(lane1, lane2, nbytes).tolist()
    want = [values.words_finish(int(a), int(b), int(n)) for a, b, n in zip(lane1, lane2, nbytes)]
    assert got == want == [1, 1, 1]
    # and an ordinary value still finishes as the host's hash
    x = np.arange(7, dtype=np.float32)
    a, b = values.words_lanes(x.tobytes())
    assert digest_results.finish_all(np.array([a], np.uint64), np.array([b], np.uint64),
                                 [x.nbytes]).tolist() == [values.words_digest(x)]


def _record_mlp(mlp, out, level, eager=False):
    """Record 3 jitted steps of fixtures/jax_mlp.py's small MLP in this process at `level`
    with compiled values and words64 hashes (`eager`: then an eager value of a new shape)."""
    import tracediff

    with tracediff.record(out, level=level, jax_values="compiled", hash="words64",
                          frameworks=("jax",)):
        step, params, state = mlp.build((8, 16, 16, 4), 4)
        step = jax.jit(step)
        for _ in range(3):
            params, state, _ = step(params, state)
        if eager:
            jax.numpy.tanh(params["Dense_0"]["kernel"])


def test_values_digested_by_group_programs_write_the_trace_digested_inside(tmp_path,
                                                                          monkeypatch):
    """A values program returns its values, digested after it by group programs compiled
    once per dtype, shape and group size (digest_groups.py: on a TPU v5e each value digested
    inside a values program cost ~0.4 s of its compile), where they fit in a share of the
    device's memory; else it digests them inside, as before. Either way, and with groups
    turned off, the trace is the host's, hash by hash, and the statistics agree."""
    import importlib.util

    from tracediff.capture.jax import digest_groups

    from .helpers import ROOT

    spec = importlib.util.spec_from_file_location("jax_mlp", f"{ROOT}/fixtures/jax_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    big = digest_groups.RETURN_CPU
    # name: (on the device, groups, memory for returned values, calls before the switch to
    # the program that digests inside)
    runs = {"groups": ("1", "1", big, 1000), "inside": ("1", "1", 0, 1000),
            "off": ("1", "0", big, 1000), "host": ("0", "1", 0, 1000),
            "switched": ("1", "1", big, 1), "unstacked": ("1", "1", big, 1000)}
    traces = {}
    for name, (device, groups, budget, calls) in runs.items():
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_GROUPS", groups)
        monkeypatch.setattr(digest_groups, "RETURN_CPU", budget)
        monkeypatch.setattr(digest_groups, "INSIDE_AFTER_CALLS", calls)
        # unstacked: every value digested where it lies (on a TPU, those of 8 MB and more)
        monkeypatch.setattr(digest_groups, "UNSTACKED_BYTES", 0 if name == "unstacked" else
                            8 << 20)
        out = traces[name] = tmp_path / f"{name}.h5"
        _record_mlp(mlp, out, "stats")
    groups = {k: _manifest(traces[k])["frameworks"]["jax"]["digests_on_device"]["groups"]
              for k in ("groups", "inside", "off", "switched", "unstacked")}
    assert groups["unstacked"]["groups_run"] > groups["groups"]["groups_run"] // 2
    assert groups["groups"]["values_programs_returning_values"] >= 2   # init, step
    assert groups["switched"]["groups_run"] < groups["groups"]["groups_run"]
    assert groups["groups"]["values_programs_digesting_inside"] == 0
    assert groups["groups"]["groups_run"] > 0
    assert groups["inside"]["values_programs_returning_values"] == 0
    assert groups["inside"]["values_programs_digesting_inside"] >= 2
    assert groups["off"] is None
    with h5py.File(traces["host"], "r") as fh:
        host_values = fh["values"][:]
        host_stats = np.sort(fh["stats"][:], order="value")
    with h5py.File(traces["off"], "r") as f:
        before = np.sort(f["stats"][:], order="value")   # the device path as it was
    assert len(host_values) > 100
    for name in ("groups", "inside", "off", "switched", "unstacked"):
        with h5py.File(traces[name], "r") as f:
            vals, stats = f["values"][:], np.sort(f["stats"][:], order="value")
        assert (vals["hash"] == host_values["hash"]).all(), name
        assert (stats["value"] == before["value"]).all(), name
        assert (stats[["nan", "inf"]] == before[["nan", "inf"]]).all(), name
        for field in ("min", "max", "mean", "l2"):
            assert np.allclose(stats[field], before[field], rtol=1e-6, equal_nan=True), \
                (name, field)
            # the host's too: PRNG key data (the initialiser's) has no statistics on either
            assert np.allclose(stats[field], host_stats[field], rtol=1e-5, equal_nan=True), \
                (name, field)


def test_eager_values_wait_for_their_program_and_survive_donation(tmp_path, monkeypatch):
    """An eager value whose digest program is still compiling in the background
    (`DigestGroups.digest`: a model's first values of several shapes compile side by side)
    waits as tracediff's own copy and is digested at the next drain: the script deleting
    or donating the value meanwhile changes nothing, and the trace is the host path's,
    hash by hash."""
    import time

    import tracediff
    from tracediff.capture.jax import digest_groups

    compile_now = digest_groups.DigestGroups._compile

    def slow_compile(self, *args):
        time.sleep(1.0)
        return compile_now(self, *args)

    monkeypatch.setattr(digest_groups.DigestGroups, "_compile", slow_compile)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    jnp = jax.numpy
    traces, ends = {}, {}
    for name, device in (("device", "1"), ("host", "0")):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        out = traces[name] = tmp_path / f"{name}.h5"
        with tracediff.record(out, level="stats", hash="words64", frameworks=("jax",)):
            step = jax.jit(lambda w, g: w - 0.1 * g, donate_argnums=0)
            w = jnp.linspace(-1, 1, 4096, dtype=jnp.float32).reshape(64, 64) * 3
            g = jnp.cos(w) + 1
            scratch = jnp.sin(jnp.ones((3, 7), jnp.float32))   # a new shape: it waits
            scratch.delete()                                   # freed before any drain
            for _ in range(3):
                w = step(w, g)
            ends[name] = np.asarray(w)
    assert np.array_equal(ends["device"], ends["host"])
    groups = _manifest(traces["device"])["frameworks"]["jax"]["digests_on_device"]["groups"]
    assert groups["values_waited_for_their_program"] >= 1
    with h5py.File(traces["device"], "r") as fd, h5py.File(traces["host"], "r") as fh:
        vd, vh = fd["values"][:], fh["values"][:]
        assert len(vd) == len(vh) > 5
        assert (vd["hash"] == vh["hash"]).all()


def test_values_held_for_their_program_stay_within_wait_bytes(tmp_path, monkeypatch):
    """The copies held while their program compiles are bounded by WAIT_BYTES (a model's
    first values can be its whole state), set here to two of the script's 4 KB values
    exactly: its input and the device copy made of it wait, the next value (inside the
    first `sin`) would pass the bound, so the script waits there for the program (held back
    here) instead of holding a third copy, and three values waited in all, the rest digested
    by the program compiled by then; the trace is the host path's, hash by hash. Unbounded,
    the script ran on with 13 of its 20 values held."""
    import threading
    import time

    import tracediff
    from tracediff.capture.jax import digest_groups

    compile_now = digest_groups.DigestGroups._compile
    gate = threading.Event()

    def held_compile(self, *args):
        gate.wait(30)   # opened once the script has stopped making values, or at its end
        return compile_now(self, *args)

    def watch(made, done, stopped):
        """Open the gate where the script makes no value for 1 s (it waits at the bound)."""
        seen, since = -1, time.monotonic()
        while not done.is_set():
            if len(made) != seen:
                seen, since = len(made), time.monotonic()
            elif time.monotonic() - since > 1.0:
                stopped.append(seen)
                break
            time.sleep(0.02)
        gate.set()

    monkeypatch.setattr(digest_groups.DigestGroups, "_compile", held_compile)
    monkeypatch.setattr(digest_groups, "WAIT_BYTES", 8192)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    jnp = jax.numpy
    x0 = np.linspace(-1, 1, 1024, dtype=np.float32).reshape(8, 128)   # 4 KB a value
    x = jnp.asarray(x0)
    for _ in range(6):   # the script's own programs compiled before the recordings
        x = jnp.sin(x)
    traces, ends, stopped = {}, {}, {}
    for name, device in (("host", "0"), ("device", "1")):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        gate.clear()
        made, done, stopped[name] = [], threading.Event(), []
        watcher = threading.Thread(target=watch, args=(made, done, stopped[name]))
        out = traces[name] = tmp_path / f"{name}.h5"
        try:
            with tracediff.record(out, level="stats", hash="words64", frameworks=("jax",)):
                watcher.start()
                x = jnp.asarray(x0)
                for _ in range(6):
                    x = jnp.sin(x)
                    made.append(x.shape)
                done.set()
                ends[name] = np.asarray(x)
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
    assert stopped == {"host": [], "device": [0]}, stopped
    assert np.array_equal(ends["device"], ends["host"])
    groups = _manifest(traces["device"])["frameworks"]["jax"]["digests_on_device"]["groups"]
    assert groups["values_waited_for_their_program"] == 3, groups
    with h5py.File(traces["device"], "r") as fd, h5py.File(traces["host"], "r") as fh:
        vd, vh = fd["values"][:], fh["values"][:]
        assert len(vd) == len(vh) > 6
        assert (vd["hash"] == vh["hash"]).all()


def _stored_hashes_match_bytes(path):
    """(rows whose hash is the words64 of the bytes the trace stores for them, rows)."""
    with h5py.File(path, "r") as f:
        rows, blob = f["values"][:], f["blob"]
        stored = rows[(rows["offset"] >= 0) & (rows["nbytes"] > 0)]
        same = sum(values.words_digest(np.asarray(blob[r["offset"]:r["offset"] + r["nbytes"]]))
                   == int(r["hash"]) for r in stored)
    return same, len(stored)


def test_a_calls_outputs_programs_compile_while_it_runs_and_its_outputs_wait(tmp_path,
                                                                            monkeypatch):
    """At `--level calls` a jitted function's outputs' digest programs start compiling
    before its first call runs (beside JAX's compile of the function itself), and its
    outputs wait, as tracediff's own copies, while they compile: the calls return with
    every program still held back, the script donating the outputs meanwhile, and the
    trace is the host path's hash by hash (on a TPU v5e those compiles took 9.5 s of a
    20-step MLP's script thread at its first calls). Outputs over WAIT_BYTES are not
    copied to wait (a model's whole state would double on the device): the call waits."""
    import threading

    import tracediff
    from tracediff.capture.jax import digest_groups

    compile_now = digest_groups.DigestGroups._compile
    gate, held_up, step_compiled = threading.Event(), [], {}
    holder = {}

    def gated_compile(self, key, device, with_stats, settings):
        if key[0] == (48, 40) and "step" in holder:   # the step's first output
            step_compiled.setdefault("at_submit", holder["step"]._cache_size())
        if not gate.wait(20):
            held_up.append(key)
        return compile_now(self, key, device, with_stats, settings)

    monkeypatch.setattr(digest_groups.DigestGroups, "_compile", gated_compile)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((48, 40)).astype(np.float32)
    g0 = rng.standard_normal((48, 40)).astype(np.float32)
    traces, ends, returned = {}, {}, {}
    for name, device, bound in (("device", "1", 1 << 30), ("host", "0", 1 << 30),
                                ("bounded", "1", 4096)):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        # bounded: outputs over WAIT_BYTES (7.7 KB a call) are not copied to wait; the
        # call waits for its program instead (let through after 0.5 s)
        monkeypatch.setattr(digest_groups, "WAIT_BYTES", bound)
        gate.clear()
        if name == "bounded":
            threading.Timer(0.5, gate.set).start()
        out = traces[name] = tmp_path / f"{name}.h5"
        with tracediff.record(out, level="calls", hash="words64", frameworks=("jax",)):
            step = holder["step"] = jax.jit(lambda w, g: (w - 0.1 * g, jnp.sum(w * g)),
                                            donate_argnums=0)
            w, g = jnp.asarray(w0), jnp.asarray(g0)
            for _ in range(3):
                w, s = step(w, g)
            returned[name] = not gate.is_set()
            gate.set()
            ends[name] = (np.asarray(w), float(s))
        holder.clear()
    assert not held_up, "the script's thread waited for a program held back"
    assert returned["device"]
    assert step_compiled["at_submit"] == 0, "the outputs' program started after the call ran"
    assert np.array_equal(ends["device"][0], ends["host"][0])
    assert ends["device"][1] == ends["host"][1]
    groups = {k: _manifest(traces[k])["frameworks"]["jax"]["digests_on_device"]["groups"]
              for k in ("device", "bounded")}
    assert groups["device"]["values_waited_for_their_program"] >= 6   # 3 calls, 2 outputs
    assert groups["bounded"]["values_waited_for_their_program"] == 0
    for name in ("device", "bounded"):
        with h5py.File(traces[name], "r") as fd, h5py.File(traces["host"], "r") as fh:
            vd, vh = fd["values"][:], fh["values"][:]
            assert len(vd) == len(vh)
            assert (vd["hash"] == vh["hash"]).all(), name
            outs = vd[vd["role"] == schema.ROLE_OUT]
            assert len(outs) >= 6 and (outs["hash"] != 0).all()


def test_a_values_program_compiles_beside_the_scripts_own_unless_the_call_donates(
        tmp_path, monkeypatch):
    """A jitted function's first call that donates nothing runs the script's program (and
    its compile) first, while the values program compiles in a background thread (on a TPU
    v5e a 4096-wide MLP step's two took 4.2 and 3.2 s one after the other); one that
    donates runs the values program first, on arguments still alive. Either way each call
    has its values program's events (no replay), and the trace is the one recorded with
    values hashed on the host, hash by hash."""
    import threading

    import tracediff
    from tracediff.capture.jax import program_cache

    compile_now = program_cache.ProgramCache.compile
    where = []

    def noted_compile(self, lowered, devices, settings):
        if "jit_program" in lowered.as_text()[:2000]:   # a values program
            where.append(threading.current_thread() is threading.main_thread())
        return compile_now(self, lowered, devices, settings)

    monkeypatch.setattr(program_cache.ProgramCache, "compile", noted_compile)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    jnp = jax.numpy
    w0 = np.linspace(-1, 1, 48 * 40, dtype=np.float32).reshape(48, 40)
    traces, ends, ran_on_main = {}, {}, {}
    for name, device, donate in (("kept", "1", ()), ("donated", "1", (0,)),
                                 ("host", "0", ())):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        where.clear()
        out = traces[name] = tmp_path / f"{name}.h5"
        with tracediff.record(out, level="stats", jax_values="compiled", hash="words64",
                              frameworks=("jax",)):
            step = jax.jit(lambda w, g: (jnp.tanh(w) - 0.1 * g, jnp.sum(w * g)),
                           donate_argnums=donate)
            w, g = jnp.asarray(w0), jnp.asarray(w0 * 0.5)
            for _ in range(3):
                w, s = step(w, g)
            ends[name] = (np.asarray(w), float(s))
        ran_on_main[name] = list(where)
    assert ran_on_main["kept"] and not any(ran_on_main["kept"]), ran_on_main
    assert ran_on_main["donated"] and all(ran_on_main["donated"]), ran_on_main
    for name in ("kept", "donated"):
        assert np.array_equal(ends[name][0], ends["host"][0]) and ends[name][1] == ends["host"][1]
        jm = _manifest(traces[name])["frameworks"]["jax"]
        assert jm["compiled_values"]["calls"] == 3 and not jm["compiled_values"]["errors"], name
        with h5py.File(traces[name], "r") as f, h5py.File(traces["host"], "r") as fh:
            assert (f["values"]["hash"][:] == fh["values"]["hash"][:]).all(), name


def test_full_level_values_are_hashed_by_group_programs_as_stored(tmp_path, monkeypatch):
    """At level full a values program returns its values (the small ones joined by a program
    of their own after it) and group programs hash them, where each value's hash used to
    cost the values program its compile (on a TPU v5e a Flax block's step: 61 s); the
    join's program compiles beside it; an eager value of a shape whose
    program is still compiling is hashed on the host meanwhile; small values are joined on
    the host while the join's program compiles; past INSIDE_AFTER_CALLS
    calls the program that hashes inside takes over. Every stored value's hash is that of
    its stored bytes, and the values and hashes are those of the path that hashed inside
    and of the host's."""
    import concurrent.futures
    import importlib.util

    import tracediff
    from tracediff.capture.jax import digest_groups, program_cache

    from .helpers import ROOT

    spec = importlib.util.spec_from_file_location("jax_mlp", f"{ROOT}/fixtures/jax_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    monkeypatch.setenv("TRACEDIFF_XLA_CACHE", "off")
    traces = {}
    for name, device, groups, calls in (("groups", "1", "1", 1000), ("off", "1", "0", 1000),
                                        ("host", "0", "1", 1000), ("switched", "1", "1", 1),
                                        ("joined_on_host", "1", "1", 1000)):
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_ON_DEVICE", device)
        monkeypatch.setenv("TRACEDIFF_JAX_DIGEST_GROUPS", groups)
        monkeypatch.setattr(digest_groups, "INSIDE_AFTER_CALLS", calls)
        if name == "joined_on_host":   # the join's programs never done compiling
            monkeypatch.setattr(digest_groups.DigestGroups, "prepare_join", lambda self, xs, device:
                                [(list(range(len(xs))), concurrent.futures.Future())])
            monkeypatch.setattr(program_cache.CachedProgram, "ready", lambda self, *a: False)
        out = traces[name] = tmp_path / f"{name}.h5"
        _record_mlp(mlp, out, "full", eager=True)
    got = {k: _manifest(traces[k])["frameworks"]["jax"]["digests_on_device"]["groups"]
           for k in ("groups", "switched", "joined_on_host")}
    assert got["groups"]["values_programs_returning_values"] >= 2
    assert got["groups"]["values_hashed_on_host_while_their_program_compiled"] >= 1
    assert got["joined_on_host"]["values_joined_on_host_while_their_program_compiled"] > 100
    assert 0 < got["switched"]["groups_run"] < got["groups"]["groups_run"]
    # the small values joined by a program of their own, compiled beside the values program
    assert not _manifest(traces["groups"])["frameworks"]["jax"]["program_cache"]["errors"]
    with h5py.File(traces["host"], "r") as f:
        host = f["values"][:]
    assert len(host) > 100
    for name in ("groups", "off", "switched", "joined_on_host"):
        same, n = _stored_hashes_match_bytes(traces[name])
        assert same == n > 100, name
        with h5py.File(traces[name], "r") as f:
            assert (f["values"]["hash"][:] == host["hash"]).all(), name
    with tracediff.load(traces["groups"]) as a, tracediff.load(traces["host"]) as b:
        for eid in range(len(a)):
            for x, y in zip(a.outputs(eid), b.outputs(eid)):
                if x is not None and y is not None:
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), eid


def test_a_flax_blocks_full_trace_on_the_device_stores_what_it_hashed(tmp_path):
    """The Flax attention block of issue 55's target (fixtures/flax_block_adam.py: masks,
    softmax, layer norms, Adam) at level full with values hashed on the device by group
    programs: the script prints what it prints plain, and every stored value's hash is the
    words64 of its stored bytes."""
    from .helpers import run_plain

    why = xla_cpu_hashes_what_it_returns()
    if why:
        pytest.skip(why)
    out = tmp_path / "block.h5"
    env = {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1", "TRACEDIFF_XLA_CACHE": "off"}
    proc = record("flax_block_adam.py", out, "--width", "32", "--seq", "8", env=env,
                  extra=("--level", "full", "--jax-values", "compiled", "--hash", "words64"))
    assert proc.stdout == run_plain("flax_block_adam.py", "--width", "32", "--seq", "8").stdout
    groups = _manifest(out)["frameworks"]["jax"]["digests_on_device"]["groups"]
    assert groups["values_programs_returning_values"] >= 2 and groups["groups_run"] > 0
    same, n = _stored_hashes_match_bytes(out)
    assert same == n > 500


X64 = """
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
step = jax.jit(lambda x: (x * 2, jnp.tanh(x)))
x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float64)
for _ in range(2):
    x, y = step(x)
print(float(x.sum()), float(y.sum()))
"""


def test_a_batch_whose_values_all_go_to_the_host_writes_its_trace(tmp_path):
    """Under jax_enable_x64 a call's float64 outputs are summarised on the host (float32
    on the device cannot hold them), which left a batch of the device path with no
    program to read back: the recording stopped at its end ("need at least one array to
    concatenate", exit 2)."""
    script = tmp_path / "x64.py"
    script.write_text(X64)
    out = tmp_path / "x64.h5"
    proc = record(str(script), str(out), env={"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1"},
                  extra=("--level", "stats", "--jax-values", "compiled"), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with Trace(str(out)) as t:
        assert t.complete and len(t.stats_rows)
