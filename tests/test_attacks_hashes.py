"""Hostile cases against the hashes, the codec and JAX's calls fast path (issue 53).

Three batches, on small real programs recorded in this process (tracediff.record) once per
module and shared by the cases; each case is one claim a user relies on:

- every codec x hash x level x framework records a trace that `show`, `locate`, `report`
  and `slice` read (exit 0/1, never "damaged"), and whose stored bytes all read back;
- a words64 trace against an xxh3_64 trace: of one run, MATCH, or an honest INCONCLUSIVE
  where neither side stored bytes, never a difference; of a run with one op perturbed,
  DIVERGED wherever one side holds bytes;
- the JAX fast path at --level calls (jit of grad, of value_and_grad, of vmap, a jitted
  function inside another transformation, the same function jitted twice, static
  arguments, donation): the script's results are a plain run's, bit for bit, and each
  recorded call's outputs hash as the plain run's outputs do.
"""

import json

import numpy as np
import pytest

import tracediff
from tracediff.trace import schema, values

from .helpers import run_cli

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
pytest.importorskip("hdf5plugin")

import jax.numpy as jnp  # noqa: E402

# its own CI stage (pytest -m deep): a batch of hostile cases, each against its truth
pytestmark = pytest.mark.deep

CODECS = ("none", "zstd")
HASHES = ("xxh3_64", "words64")
LEVELS = ("full", "stats", "calls")
FRAMEWORKS = ("jax", "torch")


def _jax_program(perturb=False):
    """Two gradient steps of a tiny tanh layer; `perturb`: its tanh output scaled by
    1 + 1e-3 inside the jitted loss (one op more, beyond float32's tolerance)."""
    w = jnp.linspace(-1, 1, 48, dtype=jnp.float32).reshape(6, 8)
    x = jnp.cos(jnp.arange(16, dtype=jnp.float32)).reshape(8, 2)

    @jax.jit
    def loss(w, x):
        h = jnp.tanh(w @ x)
        if perturb:
            h = h * 1.001
        return jnp.sum(h ** 2)

    step = jax.jit(jax.grad(loss))
    for _ in range(2):
        w = w - 0.1 * step(w, x)
    return np.asarray(loss(w, x))


def _torch_program(perturb=False):
    """Two SGD steps of a tiny Linear + tanh; `perturb` as `_jax_program`'s."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    for _ in range(2):
        y = torch.tanh(lin(x))
        if perturb:
            y = y * 1.001
        loss = (y ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.detach().numpy()


PROGRAMS = {"jax": _jax_program, "torch": _torch_program}


def _record(path, fw, perturb=False, **options):
    with tracediff.record(path, frameworks=(fw,), **options):
        return PROGRAMS[fw](perturb)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """{(codec, hash, level, framework[, "perturbed"]): path}: every combination, and the
    perturbed run at full and stats level under each hash (no codec)."""
    folder = tmp_path_factory.mktemp("attacks_hashes")
    out = {}
    for fw in FRAMEWORKS:
        for codec in CODECS:
            for h in HASHES:
                for level in LEVELS:
                    path = folder / f"{fw}-{codec}-{h}-{level}.h5"
                    _record(path, fw, level=level, hash=h, codec=codec)
                    out[(codec, h, level, fw)] = str(path)
        for h in HASHES:
            for level in ("full", "stats"):
                path = folder / f"{fw}-perturbed-{h}-{level}.h5"
                _record(path, fw, perturb=True, level=level, hash=h)
                out[("none", h, level, fw, "perturbed")] = str(path)
    return out, folder


COMBOS = [(c, h, lv, fw) for fw in FRAMEWORKS for c in CODECS for h in HASHES for lv in LEVELS]
COMMANDS = ("show", "locate", "report", "slice", "read")


def _combo_id(combo):
    return "-".join(combo)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("combo", COMBOS, ids=_combo_id)
def test_every_codec_hash_level_and_framework_reads_back(traces, combo, command):
    paths, folder = traces
    path = paths[combo]
    with tracediff.load(path) as t:
        assert t.manifest["recording"]["hash"] == combo[1]
        assert t.codec == combo[0]
        if command == "read":   # every stored value, checked against its hash when zstd
            n = sum(t.read_value(r) is not None for r in t.values)
            assert n > 0 or combo[2] != "full"
            return
    name = _combo_id(combo)
    args = {"show": ("show", path, "0"),
            "locate": ("locate", path, path),
            "report": ("report", path, path, "-o", folder / f"{name}.md", "--force"),
            "slice": ("slice", path, "--around", "0", "-o", folder / f"{name}.small.h5",
                      "--force")}[command]
    proc = run_cli(*args)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "damaged" not in proc.stdout + proc.stderr


PAIR_LEVELS = [("full", "full"), ("full", "stats"), ("stats", "full"), ("stats", "stats")]
PAIRS = [(fw, la, lb, ha, hb) for fw in FRAMEWORKS for la, lb in PAIR_LEVELS
         for ha, hb in (HASHES, HASHES[::-1])]


def _locate(a, b, *extra):
    proc = run_cli("locate", a, b, "--json", *extra)
    assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    return report


@pytest.mark.parametrize("pair", PAIRS, ids=_combo_id)
def test_one_run_under_two_hash_functions_never_differs(traces, pair):
    fw, la, lb, ha, hb = pair
    paths, _ = traces
    r = _locate(paths[("none", ha, la, fw)], paths[("none", hb, lb, fw)])
    assert r["first_difference"] is None and r["first_beyond_tolerance"] is None
    # without bytes on either side nothing is compared: INCONCLUSIVE, never a MATCH
    assert r["verdict"] == ("inconclusive" if la == lb == "stats" else "match")


@pytest.mark.parametrize("pair", PAIRS, ids=_combo_id)
def test_a_perturbed_run_under_another_hash_function_diverges(traces, pair):
    fw, la, lb, ha, hb = pair
    paths, _ = traces
    r = _locate(paths[("none", ha, la, fw)], paths[("none", hb, lb, fw, "perturbed")])
    if la == lb == "stats":   # hashes of two functions, no bytes: not evidence either way
        assert r["verdict"] == "inconclusive" and r["first_difference"] is None
    else:
        assert r["verdict"] == "diverged" and r["first_beyond_tolerance"] is not None


# -- JAX's calls fast path ---------------------------------------------------------------------
def _loss(w):
    return jnp.sum(jnp.tanh(w @ w.T) ** 2)


def _power(x, n):
    return x ** n


def _bump(x):
    return x * 2.0 + 1.0


W = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)


def _inputs():
    """The patterns' arguments, made before a recording starts (an eager op inside it is a
    call of its own) and anew for each run (donation deletes them)."""
    w = jnp.asarray(W)
    return {"w": w, "2w": w * 2, "-w": -w, "3w": w * 3, "w[:2]": w[:2], "w[:3]": w[:3],
            "stack": jnp.stack([w, -w, w * 3]), "d1": jnp.asarray(W), "d2": jnp.asarray(W) * 3}


def _pattern(name, jit, v):
    """[(function, args)] of one call pattern, its jits made with `jit` (jax.jit, patched
    or not), its arguments from `_inputs()`."""
    if name == "jit_grad":
        g = jit(jax.grad(_loss))
        return [(g, (v["w"],)), (g, (v["2w"],))]
    if name == "jit_and_jit_grad_interleaved":
        f = jit(_loss)
        g = jit(jax.grad(f))
        return [(f, (v["w"],)), (g, (v["w"],)), (f, (v["2w"],)), (g, (v["2w"],))]
    if name == "jit_value_and_grad_of_jitted":
        f = jit(_loss)
        return [(jit(jax.value_and_grad(f)), (v["w"],)), (f, (v["w"],))]
    if name == "jit_vmap_of_jitted":
        f = jit(_loss)
        return [(jit(jax.vmap(f)), (v["stack"],)), (f, (v["w"],))]
    if name == "same_function_jitted_twice":
        a, b = jit(_loss), jit(_loss)
        return [(a, (v["w"],)), (b, (v["w[:2]"],)), (a, (v["w[:3]"],)), (b, (v["w"],))]
    if name == "same_function_static_args":
        p, q = jit(_power, static_argnums=1), jit(_power, static_argnums=1)
        return [(p, (v["w"], 2)), (q, (v["w"], 3)), (p, (v["w"], 3))]
    if name == "donate_argnums":
        d = jit(_bump, donate_argnums=0)
        return [(d, (v["d1"],)), (d, (v["d2"],))]
    if name == "jit_of_jit_grad":
        return [(jit(jit(jax.grad(jit(_loss)))), (v["w"],))]
    raise KeyError(name)


PATTERNS = ("jit_grad", "jit_and_jit_grad_interleaved", "jit_value_and_grad_of_jitted",
            "jit_vmap_of_jitted", "same_function_jitted_twice", "same_function_static_args",
            "donate_argnums", "jit_of_jit_grad")


def _run(calls):
    return [[np.asarray(x) for x in jax.tree_util.tree_leaves(fn(*args))] for fn, args in calls]


@pytest.fixture(scope="module")
def fast_path(tmp_path_factory):
    """{(pattern, hash): (plain outputs, recorded outputs, trace path)}."""
    folder = tmp_path_factory.mktemp("attacks_fast_path")
    out = {}
    for name in PATTERNS:
        plain = _run(_pattern(name, jax.jit, _inputs()))
        for h in HASHES:
            path = folder / f"{name}-{h}.h5"
            inputs = _inputs()
            try:
                with tracediff.record(path, level="calls", frameworks=("jax",), hash=h):
                    got = _run(_pattern(name, jax.jit, inputs))   # jax.jit: the recorder's
            except Exception as exc:   # the recording changed the program: each case says so
                got = exc
            out[(name, h)] = (plain, got, str(path))
    return out


FAST_CASES = [(p, h) for p in PATTERNS for h in HASHES]


@pytest.mark.parametrize("case", FAST_CASES, ids=_combo_id)
def test_fast_path_leaves_the_programs_results_bitwise(fast_path, case):
    plain, got, _ = fast_path[case]
    assert not isinstance(got, Exception), f"the recorded program raised {got!r}"[:300]
    assert [[x.shape for x in c] for c in got] == [[x.shape for x in c] for c in plain]
    assert all(x.tobytes() == y.tobytes() for c, d in zip(got, plain) for x, y in zip(c, d))


@pytest.mark.parametrize("case", FAST_CASES, ids=_combo_id)
def test_fast_path_records_each_calls_real_outputs(fast_path, case):
    """Each recorded call's output rows hash as the plain run's outputs of that call do
    (shape and hash: a jit(grad(f)) recorded with f's scalar fails here)."""
    plain, got, path = fast_path[case]
    assert not isinstance(got, Exception), f"the recorded program raised {got!r}"[:300]
    with tracediff.load(path) as t:
        digest = values.DIGESTS[t.manifest["recording"]["hash"]]
        calls = [e for e in range(len(t)) if t.event(e)["kind"] == "call"]
        assert len(calls) == len(plain)
        for e, outs in zip(calls, plain):
            rows = t.value_rows(e, schema.ROLE_OUT)
            rows = rows[np.argsort(rows["slot"], kind="stable")]
            assert [values.parse_shape(t.string(r["shape"])) for r in rows] == \
                [tuple(x.shape) for x in outs]
            assert [int(r["hash"]) for r in rows] == \
                [digest(values.prepare(x)[0]) for x in outs]
        fast = (t.manifest["frameworks"]["jax"].get("calls_on_fast_path") or {}).get("calls", 0)
        assert fast == (0 if case[0] == "same_function_static_args" else len(plain))


def test_the_attack_batch_is_large_enough():
    n = len(COMBOS) * len(COMMANDS) + 2 * len(PAIRS) + 2 * len(FAST_CASES)
    assert n >= 50
