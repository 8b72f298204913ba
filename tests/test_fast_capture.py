"""Faster capture keeps its word: statistics computed by the frameworks equal numpy's on
the same recorded values (NaN/Inf counts and L2 included), and `--jax-values compiled`
records every equation with values that say where they came from.

Recorded in process (tracediff.record), once per module; tiny shapes."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import tracediff
from tracediff.capture.jax import xla_stats
from tracediff.capture.torch import stats as torch_stats
from tracediff.trace import schema, values
from tracediff.trace.reader import Trace

from .stats_truth import assert_float64_truth, float32_tolerances, hostile_values


def _torch_program():
    """Ops whose outputs hold NaN, +-Inf, large and small values, several dtypes."""
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    y = torch.log(x)                                   # NaN where x < 0
    z = torch.tensor([1.0, -2.0, 0.0, 3.0]) / torch.tensor([0.0, 0.0, 0.0, 1.0])  # inf, -inf, nan
    big = torch.randn(40_000) * 3                       # > 64 KB: reduced on its own
    w = torch.arange(7, dtype=torch.int64) * 3          # integers
    h = torch.randn(5, 3, dtype=torch.float64).sum(0)
    m = x.mm(x.t()).relu()
    return [y, z, big.abs().sum(), big * 2, w + 1, h, m]


@pytest.fixture(scope="module")
def torch_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fast_torch")
    paths = {}
    for level in ("full", "stats"):
        paths[level] = str(folder / f"{level}.h5")
        with tracediff.record(paths[level], level=level, frameworks=("torch",)):
            _torch_program()
    return paths


def _np_stats(x):
    """The definitions, written plainly with numpy (float64)."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    nan = np.isnan(a)
    fin = np.isfinite(a)
    notnan = a[~nan]
    return {"min": notnan.min() if notnan.size else np.nan,
            "max": notnan.max() if notnan.size else np.nan,
            "mean": a[fin].mean() if fin.any() else np.nan,
            "l2": np.sqrt(np.sum(a[fin] ** 2)), "nan": int(nan.sum()),
            "inf": int((~fin & ~nan).sum())}


def test_torch_stats_level_equals_numpy_on_the_recorded_values(torch_pair):
    """Every op value of the stats trace: its statistics (computed by torch ops) equal
    numpy's on the bytes the full trace stored for the same op, and its hash equals the
    full trace's hash of those bytes."""
    with Trace(torch_pair["full"]) as full, Trace(torch_pair["stats"]) as st:
        assert len(full) == len(st)
        assert st.manifest["frameworks"]["torch"]["statistics"].startswith("torch ops")
        checked = saw_nan = saw_inf = 0
        for eid in range(len(full)):
            fe, se = full.event(eid), st.event(eid)
            assert (fe["op"], fe["source"]) == (se["op"], se["source"])
            if fe["kind"] != "op":
                continue
            for rf, rs in zip(full.value_rows(eid), st.value_rows(eid)):
                x = full.read_value(rf)
                if x is None or x.dtype.kind not in "fiub" or not x.size:
                    continue
                assert rs["flags"] & schema.VFLAG_STATS
                assert int(rs["hash"]) == int(rf["hash"])
                got, want = st.value_stats(rs), _np_stats(x)
                assert got["nan"] == want["nan"] and got["inf"] == want["inf"], fe["op"]
                for k in ("min", "max", "mean", "l2"):
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, equal_nan=True,
                                               err_msg=f"{fe['op']} {k}")
                saw_nan += got["nan"] > 0
                saw_inf += got["inf"] > 0
                checked += 1
        assert checked >= 7 and saw_nan >= 2 and saw_inf >= 1


def test_torch_segment_stats_nan_inf_and_l2():
    x = torch.tensor([1.0, float("nan"), -3.0, float("inf"), 4.0,     # value 0
                      float("nan"), float("nan"),                     # value 1: all NaN
                      -float("inf"), 2.0])                            # value 2
    st = torch_stats.tensor_segment_stats(x, [0, 5, 7], [5, 2, 2]).numpy()
    np.testing.assert_allclose(st[0], [-3.0, np.inf, 2 / 3, np.sqrt(26.0), 1, 1])
    assert np.isnan(st[1, :3]).all() and list(st[1, 3:]) == [0, 2, 0]  # L2 of no finite element: 0
    np.testing.assert_allclose(st[2], [-np.inf, 2.0, 2.0, 2.0, 0, 1])
    # the same as the numpy reference implementation, value by value
    ref = values.segment_stats(x.numpy(), [0, 5, 7], [5, 2, 2], "float32")
    np.testing.assert_allclose(st, ref, equal_nan=True)


def test_jax_in_program_stats_equal_numpy():
    """The statistics XLA computes inside the values program (used off the CPU)."""
    a = np.array([[1.0, np.nan, -3.0], [np.inf, 4.0, 0.5]], np.float32)
    got = xla_stats.finish(np.asarray(jax.jit(xla_stats.stats_vector)(jnp.asarray(a))))
    want = values.value_stats(a)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert xla_stats.wants(jnp.ones(3)) and not xla_stats.wants(jnp.ones(0))
    assert not xla_stats.wants(jnp.ones(2, jnp.complex64))


def test_jax_in_program_stats_of_tiny_and_huge_values_are_float64s():
    """The in-program statistics sum in float32 on the device (issue 66: Adam's
    `exp_avg_sq`, at most ~1e-28, had L2 0.0): tiny, subnormal, huge, near-max and mixed
    values it takes get float64's mean and L2 and (but where the device compares a
    subnormal as 0) their exact min and max; 64-bit values keep the host's statistics."""
    kinds = ("tiny", "subnormal", "huge", "near_max", "mixed")
    fn = jax.jit(xla_stats.stats_vector)
    taken = 0
    for what, x in hostile_values(kinds, np.random.default_rng(7)):
        if not xla_stats.wants(x):
            assert x.dtype.itemsize == 8 or x.dtype.kind == "V", what   # float64, bfloat16
            continue
        for shaped in (x, x.reshape(-1, 4)):
            st = xla_stats.finish(np.asarray(fn(jnp.asarray(shaped))))
            lo, hi = x.astype(np.float64).min(), x.astype(np.float64).max()
            if min(abs(lo), abs(hi)) >= np.finfo(np.float32).tiny:   # else compared as 0
                assert st[0] == lo and st[1] == hi, (what, st[:2])
            assert_float64_truth(st[2], st[3], x, what, float32_tolerances(x.size))
            taken += 1
    assert taken == 2 * 2 * 2 * len(kinds)   # float16, float32; small, large; 1-D, rows


def _jax_train(steps=2):
    w = jnp.asarray(np.random.default_rng(0).standard_normal((8, 4)), jnp.float32)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((16, 8)), jnp.float32)
    opt = optax.adam(1e-2)
    state = opt.init(w)

    @jax.jit
    def step(w, s):
        loss, g = jax.value_and_grad(lambda q: jnp.mean(jnp.tanh(x @ q) ** 2))(w)
        u, s = opt.update(g, s, w)
        return optax.apply_updates(w, u), s, loss

    for _ in range(steps):
        w, state, loss = step(w, state)
    return float(loss)


@pytest.fixture(scope="module")
def jax_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fast_jax")
    paths, results = {}, {}
    for mode in ("replay", "compiled"):
        paths[mode] = str(folder / f"{mode}.h5")
        with tracediff.record(paths[mode], jax_values=mode, frameworks=("jax",)):
            results[mode] = _jax_train()
    results["plain"] = _jax_train()
    return paths, results


def test_jax_compiled_values_record_every_equation_and_say_so(jax_pair):
    paths, results = jax_pair
    assert results["compiled"] == results["replay"] == results["plain"]
    with Trace(paths["replay"]) as rp, Trace(paths["compiled"]) as cp:
        jm = cp.manifest["frameworks"]["jax"]
        assert jm["values"] == "compiled" and "origin=probe" in jm["mode"]
        assert cp.manifest["recording"]["jax_values"] == "compiled"
        assert rp.manifest["frameworks"]["jax"]["values"] == "replay"
        cv = jm["compiled_values"]
        assert cv["calls"] >= 2 and cv["errors"] == []

        def eqns(t, origin):
            ev = t.events
            idx = np.flatnonzero((ev["kind"] == schema.KIND_EQN) & (ev["origin"] == origin))
            return [t.event(i) for i in idx]

        rep = eqns(rp, schema.ORIGIN_REPLAY)
        com = eqns(cp, schema.ORIGIN_PROBE)
        assert not eqns(cp, schema.ORIGIN_REPLAY)
        # the same equations, in the same order, with the same names and source lines
        assert [(e["op"], e["source"], e["name_stack"]) for e in com] == \
            [(e["op"], e["source"], e["name_stack"]) for e in rep]
        # optax steps come from the compiled values too
        optim = [i for i in range(len(cp)) if cp.event(i)["kind"] == "optim"]
        assert len(optim) == 2
        # values: equal to the faithful replay's, or within float32 rounding
        differ = 0
        for a, b in zip(rep, com):
            for xa, xb in zip(rp.outputs(a["index"]), cp.outputs(b["index"])):
                if xa is None or xb is None:
                    continue
                assert xa.shape == xb.shape and xa.dtype == xb.dtype
                if xa.tobytes() != xb.tobytes():
                    differ += 1
                    if xa.dtype.kind == "f":
                        np.testing.assert_allclose(xb, xa, rtol=1e-4, atol=1e-6)
        assert differ < len(com)


def test_jax_compiled_values_locate_itself_clean(jax_pair):
    paths, _ = jax_pair
    result = tracediff.locate(paths["compiled"], paths["compiled"], explain=False)
    assert result.verdict == "match" and result.first_difference is None


def test_bad_jax_values_mode_is_refused():
    with pytest.raises(ValueError):
        tracediff.record(os.devnull, jax_values="fast")


def test_device_batch_reads_values_back_as_the_host_path_stores_them(tmp_path):
    """The accelerator path (capture/torch/device.py), run with CPU tensors: values held
    as device copies and read back at the flush get the same hashes, bytes and
    statistics as values stored at once; a later in-place write does not leak in."""
    from tracediff.capture.torch import device as torch_device
    from tracediff.trace.writer import TraceWriter

    xs = [torch.randn(3, 4), torch.tensor([1.0, float("nan"), float("inf")]),
          torch.arange(5, dtype=torch.int32), torch.randn(2, 2).to(torch.bfloat16)]
    for level in ("full", "stats"):
        w = TraceWriter(tmp_path / f"dev_{level}.h5", {})
        w.level = level
        batch = torch_device.DeviceBatch(w, torch)
        eid = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OP, op="test")
        for slot, x in enumerate(xs):
            batch.add(eid, slot, x, *torch_device.storage_name(torch, x.dtype), schema.ROLE_OUT, None)
        originals = [x.clone() for x in xs]
        xs[0].mul_(2)   # written after the op: the recorded value is the one before
        w.close()
        xs[0].copy_(originals[0])
        with Trace(tmp_path / f"dev_{level}.h5") as t:
            rows = t.value_rows(eid)
            assert len(rows) == len(xs)
            for r, x in zip(rows, originals):
                bits = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
                assert int(r["hash"]) == values.digest(bits.numpy().tobytes())
                if level == "full":
                    assert t.read_value(r).tobytes() == bits.numpy().tobytes()
                else:
                    got = t.value_stats(r)
                    want = _np_stats(x.float().numpy())
                    assert got["nan"] == want["nan"] and got["inf"] == want["inf"]
                    for k in ("min", "max", "mean", "l2"):
                        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("reducer", [values.segment_stats, torch_stats.segment_stats],
                         ids=["numpy", "torch"])
def test_a_small_values_statistics_do_not_depend_on_its_batch(reducer):
    """The writer reduces small values in batches whose makeup follows its flush clock
    (a flush every 2 s): a value reduced alone, or beside others, must get the same
    statistics bit for bit, or two recordings of one run differ where the machine was
    busy (tests/test_jax_fastjit.py's hook-against-fast comparison failed so under
    load: a float32 sum alone, a float64 one in a batch)."""
    rng = np.random.default_rng(0)
    small = (rng.standard_normal(5) * [1e-3, 1.0, 1e4, -7.0, 3.3]).astype(np.float32)
    other = rng.standard_normal(30).astype(np.float32)
    alone = reducer(small, [0], [small.size], "float32")[0]
    batch = np.concatenate([other, small])
    beside = reducer(batch, [0, other.size], [other.size, small.size], "float32")[1]
    assert alone.tolist() == beside.tolist()


@pytest.mark.parametrize("reducer", [values.segment_stats, torch_stats.segment_stats],
                         ids=["numpy", "torch"])
def test_a_small_values_statistics_do_not_depend_on_a_nan_beside_it(reducer):
    """A NaN or Inf anywhere in a batch sends the whole batch down the non-finite path;
    a finite value there must get the statistics it gets in a finite batch (two
    recordings of one MLP differed in 54-67 L2s of 1,153 where the flush clock put a NaN
    in another batch)."""
    rng = np.random.default_rng(1)
    small = (rng.standard_normal(200) * 1.7).astype(np.float32)
    for bad in (np.nan, np.inf):
        other = np.array([1.0, bad, 2.0], np.float32)
        finite = reducer(np.concatenate([np.ones(3, np.float32), small]), [0, 3],
                         [3, small.size], "float32")[1]
        beside = reducer(np.concatenate([other, small]), [0, 3], [3, small.size],
                         "float32")[1]
        assert finite.tolist() == beside.tolist()


def test_two_recordings_of_one_run_hold_the_same_statistics_whatever_the_flush_clock(
        tmp_path, monkeypatch):
    """The same JAX program recorded at --level calls twice, once with a flush after
    every value (a slow, busy machine), holds the same rows."""
    from tracediff.trace.writer import settings

    from .helpers import first_difference

    f = jax.jit(lambda x: jnp.sin(x) * 3.1 + jnp.cumsum(x) / 7)   # one value a call
    x = jnp.linspace(-1.3, 2.9, 13, dtype=jnp.float32)
    paths = []
    for clock in (settings.FLUSH_SECONDS, 0.0):
        monkeypatch.setattr(settings, "FLUSH_SECONDS", clock)
        paths.append(tmp_path / f"flush{clock}.h5")
        with tracediff.record(paths[-1], level="calls", frameworks=("jax",)):
            y = x
            for _ in range(3):
                y = f(y)
    assert first_difference(*paths) is None


# -- mean and L2 of values whose squares or sums leave their dtype's range (issue 66) ------

def _stats_of(reducer, x):
    """A value's statistics by `reducer` as the writer calls it: its storage dtype's
    flat array (bfloat16 as uint16 bits), its logical dtype's name."""
    flat, logical, _, _ = values.prepare(x)
    return reducer(flat.reshape(-1), [0], [x.size], logical)[0]


@pytest.mark.parametrize("reducer", [values.segment_stats, torch_stats.segment_stats],
                         ids=["numpy", "torch"])
def test_tiny_values_have_the_l2_and_mean_of_float64(reducer):
    """Adam's `exp_avg_sq` (float32, at most 4.9e-28) was stored with L2 0.0: a large
    value's float32 dot of squares below ~1e-19 underflows to 0. Tiny and subnormal
    values of every float dtype, small and large, get float64's mean and L2."""
    for what, x in hostile_values(("tiny", "subnormal"), np.random.default_rng(3)):
        st = _stats_of(reducer, x)
        assert_float64_truth(st[2], st[3], x, what)


@pytest.mark.parametrize("reducer", [values.segment_stats, torch_stats.segment_stats],
                         ids=["numpy", "torch"])
def test_huge_values_have_a_finite_l2_and_mean(reducer):
    """Squares above ~1.8e19 overflow float32, above ~1.3e154 float64, and a sum of
    values near the dtype's max overflows it: the L2 and mean stay finite wherever
    float64's are (float64 values near its max: their L2 is not)."""
    for what, x in hostile_values(("huge", "near_max", "mixed"), np.random.default_rng(4)):
        st = _stats_of(reducer, x)
        assert_float64_truth(st[2], st[3], x, what)


def _torch_batch(flat, starts, counts, logical):
    """torch's statistics of a batch as a device batch gets them (tensor_segment_stats)."""
    return torch_stats.tensor_segment_stats(torch.from_numpy(flat), starts, counts).numpy()


@pytest.mark.parametrize("reducer", [values.segment_stats, _torch_batch],
                         ids=["numpy", "torch"])
def test_a_tiny_or_huge_small_values_statistics_are_right_in_any_batch(reducer):
    """float64 values of a batch square in float64, which underflows below ~1e-154 and
    overflows above ~1.3e154: such a value's mean and L2 are float64's, and the same bit
    for bit alone, beside others, and beside a NaN (the batch's non-finite path)."""
    rng = np.random.default_rng(5)
    other = rng.standard_normal(30)
    for what, x in hostile_values(("tiny", "subnormal", "huge", "near_max", "mixed"), rng):
        if x.dtype != np.float64 or x.nbytes >= values.WHOLE_VALUE_BYTES:
            continue
        alone = reducer(x, [0], [x.size], "float64")[0]
        assert_float64_truth(alone[2], alone[3], x, what)
        for first in (other, np.concatenate([other[:3], [np.nan], other[4:]])):
            batch = np.concatenate([first, x])
            beside = reducer(batch, [0, first.size], [first.size, x.size], "float64")[1]
            assert beside.tolist() == alone.tolist(), what


@pytest.mark.parametrize("reducer", [values.segment_stats, torch_stats.segment_stats],
                         ids=["numpy", "torch"])
def test_a_huge_value_holding_nan_or_inf_has_the_mean_of_its_finite_numbers(reducer):
    """A float64 value whose squares leave float64 (summed scaled) and that holds NaN and
    Inf: its mean and L2 are those of its finite numbers, as every other value's are
    (NaN and Inf counted apart), small or large."""
    rng = np.random.default_rng(8)
    for what, x in hostile_values(("huge", "near_max", "mixed"), rng):
        if x.dtype != np.float64:
            continue
        x = x.copy()
        x[::3] = np.nan
        x[1::7] = np.inf
        finite = x[np.isfinite(x)]
        st = _stats_of(reducer, x)
        assert (st[4], st[5]) == (np.isnan(x).sum(), np.isinf(x).sum()), what
        assert_float64_truth(st[2], st[3], finite, what)
