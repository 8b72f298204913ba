"""Recording levels (full / stats / calls) and windows (--steps, --ops, --modules,
--max-bytes) on real recordings, locate across levels, and the two-level search end to
end (cheap traces -> locate prints zoom commands -> run them -> locate names the op)."""

import json
import os

import numpy as np
import pytest

import tracediff
from tracediff.trace import schema, values

from .conftest import GRU_STEPS, MKL_SSE as SSE, TANH_ULP, TORCH_GRU_STEPS as TORCH_STEPS
from .helpers import locate_json, run_cli, run_printed_command

TORCH_GRU = "torch_gru_adam.py"


@pytest.fixture(scope="module")
def torch_runs(recorded, tmp_path_factory):
    args = ("--steps", TORCH_STEPS)
    jobs = {
        "full": (TORCH_GRU, args, None),
        "stats": (TORCH_GRU, args, None, ["--level", "stats"]),
        "calls": (TORCH_GRU, args, None, ["--level", "calls"]),
        "sse_full": (TORCH_GRU, args, SSE),
        "sse_stats": (TORCH_GRU, args, SSE, ["--level", "stats"]),
        "sse_calls": (TORCH_GRU, args, SSE, ["--level", "calls"]),
        "steps": (TORCH_GRU, args, None, ["--steps", "1:2"]),
        "ops": (TORCH_GRU, args, None, ["--ops", "^aten::addmm"]),
        "modules": (TORCH_GRU, args, None, ["--modules", "head*"]),
        "cap": (TORCH_GRU, args, None, ["--max-bytes", "200KB"]),
    }
    paths = recorded.many(jobs)
    plain = recorded.plain(TORCH_GRU, *args).stdout
    runs = {k: (str(p), recorded.proc(p)) for k, p in paths.items()}
    return runs, plain, tmp_path_factory.mktemp("torch_levels")


@pytest.fixture(scope="module")
def jax_runs(jax_gru, recorded, tmp_path_factory):
    d = tmp_path_factory.mktemp("jax_levels")
    args = ("--steps", GRU_STEPS)
    script = "jax_gru_expm_adam.py"
    jobs = {
        "stats": (script, args, None, ["--level", "stats"]),
        "tanh_stats": (script, args, TANH_ULP, ["--level", "stats"]),
        "calls": (script, args, None, ["--level", "calls"]),
        "tanh_calls": (script, args, TANH_ULP, ["--level", "calls"]),
    }
    runs = {k: (str(p), recorded.proc(p)) for k, p in recorded.many(jobs).items()}
    runs["full"] = (str(jax_gru["a"][0]), jax_gru["a"][1])
    runs["tanh_full"] = (str(jax_gru["tanh"][0]), jax_gru["tanh"][1])
    return runs, d


def _same_run_stats(full_path, cheap_path):
    """Hashes equal and statistics equal (to rounding) for every value of the same run."""
    with tracediff.load(full_path) as f, tracediff.load(cheap_path) as s:
        assert len(f) == len(s) and len(f.values) == len(s.values)
        assert np.array_equal(f.events["op"], s.events["op"])
        stored = (f.values["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT)) == 0
        assert np.array_equal(f.values["hash"][stored], s.values["hash"][stored])
        flagged = (s.values["flags"] & schema.VFLAG_STATS) != 0
        assert flagged[stored].all() and s.blob_size == 0
        assert len(s.stats_rows) == int(flagged.sum())
        for i in np.flatnonzero(stored)[::7]:
            full = f.value_stats(f.values[i])
            cheap = s.value_stats(s.values[i])
            # sums are rounded (float32 pairwise for one large value, float64 in batches):
            # equal up to rounding relative to the value's magnitude
            scale = max(abs(full["min"]), abs(full["max"])) if np.isfinite(full["min"]) else 0
            for k in values.STAT_FIELDS:
                x, y = full[k], cheap[k]
                assert (np.isnan(x) and np.isnan(y)) or \
                    np.isclose(x, y, rtol=1e-5, atol=1e-6 * scale + 1e-30), (i, k, x, y)
        # hash is the documented xxh3_64 of the stored bytes
        row = f.values[np.flatnonzero(stored)[0]]
        raw = f._f["blob"][row["offset"]:row["offset"] + row["nbytes"]].tobytes()
        assert int(row["hash"]) == values.digest(raw)
        assert s.manifest["recording"]["hash"] == values.HASH_NAME


# -- torch ----------------------------------------------------------------------------------

def test_torch_output_unchanged_at_every_level_and_window(torch_runs):
    runs, plain, _ = torch_runs
    for key in ("full", "stats", "calls", "steps", "ops", "modules", "cap"):
        assert runs[key][1].stdout == plain, key


def test_torch_stats_match_full(torch_runs):
    runs, _, _ = torch_runs
    _same_run_stats(runs["full"][0], runs["stats"][0])
    with tracediff.load(runs["stats"][0]) as t:
        rec = t.manifest["recording"]
        assert rec["level"] == "stats" and rec["stats_values"] == len(t.stats_rows)
        # at most ~64 bytes per value for hash + statistics
        assert schema.STATS_DTYPE.itemsize + 8 <= 64


def test_torch_calls_level_records_optimizer_steps_only(torch_runs):
    runs, _, _ = torch_runs
    with tracediff.load(runs["calls"][0]) as t:
        kinds = set(t.events["kind"].tolist())
        assert kinds == {schema.KIND_OPTIM}
        assert len(t) == int(TORCH_STEPS)
        assert t.manifest["recording"]["level"] == "calls"
        assert t.manifest["frameworks"]["torch"]["optimizer_steps"] == int(TORCH_STEPS)


def test_torch_locate_across_levels_finds_the_same_first_event(torch_runs):
    runs, _, _ = torch_runs
    ref = locate_json(runs["full"][0], runs["sse_full"][0])["first_difference"]
    assert ref is not None and ref["a"]["op"].startswith("aten::addmm")
    for a, b in (("full", "sse_stats"), ("stats", "sse_full"), ("stats", "sse_stats")):
        rep = locate_json(runs[a][0], runs[b][0])
        first = rep["first_difference"]
        assert first is not None, (a, b)
        assert first["a"]["index"] == ref["a"]["index"], (a, b)
        assert first["a"]["op"] == ref["a"]["op"]
        levels = rep["levels"]
        assert levels["a"]["level"] == ("full" if a == "full" else "stats")
        assert levels["decided"], "locate does not say what it decided"
        # bitwise differences whose statistics agree cannot be judged against tolerance
        assert levels["compared_without_bytes"]["stats_undecided"] > 0
        assert levels["not_decided"]
    same = locate_json(runs["stats"][0], runs["full"][0])
    assert same["verdict"] == "match" and same["first_difference"] is None


def test_torch_steps_window(torch_runs):
    runs, _, _ = torch_runs
    with tracediff.load(runs["steps"][0]) as t, tracediff.load(runs["full"][0]) as f:
        assert set(t.events["step"].tolist()) == {1}
        assert t.manifest["recording"]["steps"] == "1:2"
        assert int((t.events["kind"] == schema.KIND_OPTIM).sum()) == 1
        full_ops = (f.events["step"] == 1) & (f.events["kind"] == schema.KIND_OP)
        assert int((t.events["kind"] == schema.KIND_OP).sum()) == int(full_ops.sum())
        assert t.manifest["frameworks"]["torch"]["optimizer_steps"] == int(TORCH_STEPS)


def test_torch_ops_and_modules_windows_keep_values_only_inside(torch_runs):
    runs, _, _ = torch_runs
    for key, inside in (("ops", lambda op, ns: op.startswith("aten::addmm")),
                        ("modules", lambda op, ns: ns.startswith("head"))):
        with tracediff.load(runs[key][0]) as t:
            rec = t.manifest["recording"]
            assert rec["ops" if key == "ops" else "modules"]
            kept = dropped = 0
            for row in t.values[t.values["role"] == schema.ROLE_OUT]:
                e = t.events[row["event"]]
                if e["kind"] != schema.KIND_OP:
                    continue
                stored = row["offset"] >= 0
                if inside(t.string(e["op"]), t.string(e["name_stack"])):
                    kept += stored
                else:
                    assert not stored, (key, t.string(e["op"]))
                    dropped += 1
            assert kept > 0 and dropped > 0, key


def test_torch_max_bytes_stops_values_and_says_so(torch_runs):
    runs, _, _ = torch_runs
    with tracediff.load(runs["cap"][0]) as t:
        rec = t.manifest["recording"]
        assert rec["max_bytes"] == 200 * 1024 and rec["max_bytes_reached"] is True
        cap_event = rec["values_capped_at_event"]
        assert "--max-bytes" in rec["note"]
        assert t.blob_size <= 200 * 1024
        late = t.values[t.values["event"] > cap_event]
        assert len(late) and (late["offset"] < 0).all()
        assert ((late["flags"] & schema.VFLAG_STATS) != 0).any()


def test_torch_two_level_workflow_end_to_end(torch_runs):
    """calls-level traces -> locate names the step and prints the zoom commands -> running
    them gives full traces of that step -> locate names the op."""
    runs, _, d = torch_runs
    a, b = runs["calls"][0], runs["sse_calls"][0]
    rep = locate_json(a, b)
    assert rep["first_difference"] is not None and rep["first_difference"]["a"]["step"] == 0
    zoom = rep["levels"]["zoom"]
    assert zoom and zoom[0]["step"] == 0
    assert any("--level full --steps 0:1" in s for s in rep["next_steps"])
    proc = run_cli("locate", a, b)
    assert "zoom in on step 0" in proc.stdout
    for side in ("a", "b"):
        cmd = zoom[0][side]["command"]
        assert "--level full --steps 0:1" in cmd
        if side == "b":
            assert cmd.startswith("MKL_CBWR=COMPATIBLE ")
        # run it as a user would: the shell parses it (quoting, the env prefix)
        res = run_printed_command(cmd)
        assert res.returncode == 0, res.stderr[-3000:]
    za, zb = zoom[0]["a"]["trace"], zoom[0]["b"]["trace"]
    assert os.path.exists(za) and os.path.exists(zb)
    final = locate_json(za, zb)
    first = final["first_difference"]
    assert first["a"]["op"].startswith("aten::addmm") and first["a"]["step"] == 0
    ref = locate_json(runs["full"][0], runs["sse_full"][0])["first_difference"]
    assert (first["a"]["op"], first["a"]["name_stack"], first["a"]["source"]) == \
        (ref["a"]["op"], ref["a"]["name_stack"], ref["a"]["source"])
    assert not final["levels"]["zoom"]


# -- JAX ------------------------------------------------------------------------------------

# the JAX levels' four recordings of the GRU seed (~60 s of the run here): CI's deep stage,
# which keeps README's test command within five minutes; the torch levels stay in it
@pytest.mark.deep
def test_jax_output_unchanged_at_every_level(jax_runs, recorded):
    runs, _ = jax_runs
    plain = recorded.plain("jax_gru_expm_adam.py", "--steps", GRU_STEPS).stdout
    for key in ("stats", "calls", "tanh_stats"):
        out = runs[key][1].stdout
        if key.startswith("tanh"):
            assert out == runs["tanh_full"][1].stdout
        else:
            assert out == plain, key


@pytest.mark.deep
def test_jax_stats_match_full(jax_runs):
    runs, _ = jax_runs
    _same_run_stats(runs["full"][0], runs["stats"][0])


@pytest.mark.deep
def test_jax_calls_level_has_calls_only_and_counts_optax_steps(jax_runs):
    runs, _ = jax_runs
    with tracediff.load(runs["calls"][0]) as t, tracediff.load(runs["full"][0]) as f:
        assert set(t.events["kind"].tolist()) == {schema.KIND_CALL}
        full_calls = f.events[f.events["kind"] == schema.KIND_CALL]
        assert len(t) == len(full_calls)
        assert [t.string(o) for o in t.events["op"]] == [f.string(o) for o in full_calls["op"]]
        jax_m = t.manifest["frameworks"]["jax"]
        assert jax_m["optimizer_steps"] == int(GRU_STEPS) and jax_m["equations"] == 0
        assert sorted(set(t.events["step"].tolist())) == list(range(int(GRU_STEPS) + 1))


@pytest.mark.deep
def test_jax_locate_across_levels(jax_runs):
    runs, _ = jax_runs
    ref = locate_json(runs["full"][0], runs["tanh_full"][0])["first_difference"]
    assert ref["a"]["op"] == "tanh"
    for a, b in (("full", "tanh_stats"), ("stats", "tanh_stats")):
        first = locate_json(runs[a][0], runs[b][0])["first_difference"]
        assert first["a"]["index"] == ref["a"]["index"] and first["a"]["op"] == "tanh", (a, b)
    rep = locate_json(runs["calls"][0], runs["tanh_calls"][0])
    first = rep["first_difference"]
    assert first is not None and first["a"]["op"].startswith("jit:") and first["a"]["step"] == 0
    assert rep["levels"]["zoom"] and rep["levels"]["zoom"][0]["step"] == 0
    assert any("calls level" in n for n in rep["levels"]["not_decided"])


def test_torch_optimizer_steps_at_stats_level_never_read_as_zero(torch_runs):
    """Two stats traces whose parameters differ bitwise: the step's size is known only by
    what the statistics prove (max abs a lower bound), never "relative L2 0, max abs 0"."""
    runs, _, _ = torch_runs
    rep = locate_json(runs["stats"][0], runs["sse_stats"][0])
    steps = [s for s in rep["optimizer_steps"] if not s["bitwise_equal"]]
    assert steps, "the SSE run's parameters differ bitwise from step 0 on"
    for s in steps:
        assert s["max_abs_is_lower_bound"] is True
        assert s["rel_l2"] is None and s["max_rel"] is None
    full = locate_json(runs["full"][0], runs["sse_full"][0])
    s0 = next(s for s in full["optimizer_steps"] if not s["bitwise_equal"])
    assert s0["max_abs_is_lower_bound"] is None and s0["rel_l2"] > 0 and s0["max_abs"] > 0
    out = run_cli("locate", runs["stats"][0], runs["sse_stats"][0]).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("optimizer steps:"))
    assert "relative L2 0," not in line and "hashes differ, recorded without bytes" in line, line


def test_small_values_statistics_are_reduced_in_cache_sized_batches(tmp_path):
    """Stats level: small values wait for statistics in per-dtype batches that are reduced
    once they reach `STATS_BATCH_BYTES`, not at the 64 MB flush (a 64 MB batch's float64
    temporaries were fresh pages on every reduction: 2.8 of the GRU loop's 5.3 s). Every
    value's statistics still equal numpy's on that value alone, across batch boundaries,
    NaN/Inf batches included."""
    from tracediff.trace import writer as W
    from tracediff.trace.writer import settings

    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(int(rng.integers(1, 4000))).astype(np.float32)
              for _ in range(1500)]   # ~12 MB: a dozen batches
    arrays[700][3] = np.nan
    arrays[701][0] = np.inf
    path = tmp_path / "small.h5"
    w = W.TraceWriter(str(path), {"script": {"name": "small"}})
    w.level = "stats"
    most_pending = 0
    for i, a in enumerate(arrays):
        e = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OP, op="aten::add")
        (w.add_array if i % 2 else w.add_value)(e, 0, a)
        most_pending = max(most_pending, w._pstats_bytes)
    w.close()
    assert most_pending < settings.STATS_BATCH_BYTES + 64 * 1024
    with tracediff.load(path) as t:
        assert len(t.stats_rows) == len(arrays)
        for row in t.values:
            got = t.value_stats(row)
            x = arrays[int(row["event"])].astype(np.float64)
            fin = x[np.isfinite(x)]
            want = {"min": np.nanmin(x), "max": np.nanmax(x), "mean": fin.mean(),
                    "l2": np.sqrt((fin * fin).sum()), "nan": np.isnan(x).sum(),
                    "inf": np.isinf(x).sum()}
            scale = np.abs(fin).max()   # float32 sums: the mean's error is relative to it
            for f in values.STAT_FIELDS:
                assert got[f] == pytest.approx(want[f], rel=1e-5, abs=1e-6 * scale), \
                    (row["event"], f)


def test_a_large_value_repeated_takes_its_statistics_from_the_first_copy(tmp_path):
    """Stats level: a large value whose bytes (hash), size and dtype equal an earlier one's
    is not reduced again (a JAX step stores ~half its bytes twice: optax tags, optimizer
    snapshots); each row still holds its own value's statistics."""
    from tracediff.trace import writer as W

    rng = np.random.default_rng(4)
    a = rng.standard_normal((256, 256)).astype(np.float32)   # 256 KB: reduced on its own
    b = a.copy()
    b[0, 0] += 1.0
    w = W.TraceWriter(str(tmp_path / "big.h5"), {"script": {"name": "big"}})
    w.level = "stats"
    reduced = []
    reducer = w.stats_reducer
    w.stats_reducer = lambda flat, *rest: reduced.append(flat.size) or reducer(flat, *rest)
    for x in (a, a.copy(), b, a.astype(np.float64), a.reshape(-1).copy()):
        e = w.add_event(framework=schema.FW_JAX, kind=schema.KIND_EQN, op="name")
        w.add_value(e, 0, x)
    w.close()
    assert reduced == [a.size] * 3   # a, b, a as float64; the copies of a took a's
    with tracediff.load(tmp_path / "big.h5") as t:
        means = [t.value_stats(row)["mean"] for row in t.values]
    assert means[0] == means[1] == means[4] != means[2]
    assert means[3] == pytest.approx(means[0], rel=1e-5)


def test_a_repeated_value_of_another_logical_dtype_has_its_own_statistics(tmp_path):
    """Stats level: the same bytes read as another dtype (a bfloat16 tensor and its
    `.view(torch.int16)`, one storage dtype) are other numbers: the repeated-value memo
    is keyed by the logical dtype too, and each row holds its own value's statistics."""
    import ml_dtypes

    from tracediff.trace import writer as W

    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 256)).astype(ml_dtypes.bfloat16)   # 128 KB: the memo's size
    w = W.TraceWriter(str(tmp_path / "views.h5"), {"script": {"name": "views"}})
    w.level = "stats"
    for arr in (x, x.view(np.uint16), x.view(np.int16)):
        e = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OP, op="aten::view.dtype")
        w.add_value(e, 0, arr)
    w.close()
    with tracediff.load(tmp_path / "views.h5") as t:
        got = [t.value_stats(row) for row in t.values]
        assert [t.string(r["dtype"]) for r in t.values] == ["bfloat16", "uint16", "int16"]
    for st, arr in zip(got, (x, x.view(np.uint16), x.view(np.int16))):
        v = arr.astype(np.float64)
        assert (st["min"], st["max"]) == (v.min(), v.max())
        assert st["mean"] == pytest.approx(v.mean(), rel=1e-5, abs=1e-6 * np.abs(v).max())


DENSE = ("flax_dense.py", "--mlp", "--jit")


@pytest.fixture(scope="module")
def mixed_hashes(recorded):
    """One small JAX run at stats and full level under each hash function, and the run
    with tanh one ULP off (tests/perturb/tanh_ulp)."""
    from .conftest import TANH_ULP as ULP

    jobs = {f"{lvl}_{h}": (DENSE[0], DENSE[1:], None, ["--level", lvl, "--hash", h])
            for lvl in ("stats", "full") for h in ("words64", "xxh3_64")}
    jobs["ulp_stats_xxh3_64"] = (DENSE[0], DENSE[1:], ULP, ["--level", "stats", "--hash", "xxh3_64"])
    return {k: str(p) for k, p in recorded.many(jobs).items()}


@pytest.mark.parametrize("a,b,verdict", [
    ("stats_words64", "stats_xxh3_64", "inconclusive"),   # no bytes: nothing compared
    ("full_words64", "stats_xxh3_64", "match"),           # a's bytes hashed with xxh3
    ("stats_words64", "full_xxh3_64", "match"),
    ("full_words64", "full_xxh3_64", "match"),
])
def test_hashes_of_two_functions_are_never_a_difference(mixed_hashes, a, b, verdict):
    """A words64 trace against an xxh3 trace of one run: where one side stored bytes they
    are hashed with the other side's function; where neither did, the pair is not
    compared (INCONCLUSIVE, coverage says so). Never "bitwise differences exist"."""
    proc = run_cli("locate", mixed_hashes[a], mixed_hashes[b], "--json")
    r = json.loads(proc.stdout)
    assert proc.returncode == r["exit_code"] == {"match": 0, "inconclusive": 3}[verdict]
    assert r["verdict"] == verdict and r["first_difference"] is None
    assert any("hash values differently" in w for w in r["warnings"])
    if verdict == "inconclusive":
        assert r["coverage"]["a"]["compared"] == 0


def test_a_perturbed_run_still_diverges_across_hash_functions(mixed_hashes):
    """The bytes of the words64 side, hashed with xxh3, differ from the one-ULP run's."""
    r = locate_json(mixed_hashes["full_words64"], mixed_hashes["ulp_stats_xxh3_64"],
                    "--rtol", "0", "--atol", "0")
    assert r["verdict"] == "diverged" and "tanh" in r["first_difference"]["a"]["op"]


def test_a_stats_trace_without_its_statistics_table_is_never_a_match(recorded, tmp_path):
    """The truth: the broken dot's run prints y = 0.0 where the correct run prints 28.0.
    Recorded at --level stats, its values hold a hash and statistics; with the statistics
    table emptied by h5py (a trace from before the table, or written without it) the
    differing hashes can be decided by nothing: those pairs are not compared (coverage),
    never read as agreeing statistics (the old answer: MATCH, exit 0)."""
    import shutil

    import h5py

    from .conftest import BROKEN_DOT

    runs = recorded.many({"full": ("torch_dot.py", (), None),
                          "stats": ("torch_dot.py", (), BROKEN_DOT, ["--level", "stats"])})
    assert recorded.proc(runs["full"]).stdout.splitlines()[0] == "28.0"
    assert recorded.proc(runs["stats"]).stdout.splitlines()[0] == "0.0"
    assert tracediff.locate(runs["full"], runs["stats"], explain=False).verdict == "diverged"
    old = tmp_path / "no_statistics.h5"
    shutil.copyfile(runs["stats"], old)
    with h5py.File(old, "r+") as f:
        dtype = f["stats"].dtype
        assert len(f["stats"]) > 0
        del f["stats"]
        f.create_dataset("stats", shape=(0,), maxshape=(None,), dtype=dtype)
    for a, b in ((runs["full"], str(old)), (str(old), runs["full"])):
        r = tracediff.locate(a, b, explain=False)
        assert r.verdict == "inconclusive" and r.exit_code == 3
        assert r.levels.compared_without_bytes["stats_missing"] == 3
        assert r.coverage.a.compared == r.coverage.a.events - 3
        assert any("no statistics" in w for w in r.warnings)
        cli = run_cli("locate", a, b, "--no-explain")
        assert cli.returncode == 3 and cli.stdout.startswith("INCONCLUSIVE"), cli.stdout
