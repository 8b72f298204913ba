"""Issue 14 item 5: the per-step table names the worst parameter by its own relative L2
(||a-b|| / ||a|| of that tensor, not max rel, which near-zero elements decide), and an op
recorded inside library code carries both the library frame and the user's frame."""

import json
import os

import numpy as np
import pytest

import tracediff
from tracediff.trace import schema

from .conftest import MKL_SSE, TORCH_GRU_STEPS
from .helpers import FIXTURES, render_terminal, run_cli


@pytest.fixture(scope="module")
def gru_steps(recorded):
    args = ("--steps", TORCH_GRU_STEPS)
    a, b = recorded("torch_gru_adam.py", *args), recorded("torch_gru_adam.py", *args, env=MKL_SSE)
    return a, b, tracediff.locate(a, b, explain=False)


def _params(t, eid):
    """{name: array} of the parameters an optimizer snapshot stored."""
    out = {}
    for r in t.value_rows(eid, schema.ROLE_OUT):
        name = t.string(r["name"]) if r["name"] >= 0 else ""
        if name.startswith("params/"):
            out[name] = np.asarray(t.read_value(r), np.float64)
    return out


def test_worst_parameter_is_chosen_by_its_own_relative_l2(gru_steps):
    a, b, r = gru_steps
    diff = [s for s in r.optimizer_steps if not s.bitwise_equal]
    assert diff, "MKL_CBWR=COMPATIBLE changes the GRU's parameters"
    with tracediff.load(a) as ta, tracediff.load(b) as tb:
        for s in diff:
            pa, pb = _params(ta, s.a), _params(tb, s.b)
            rel = {k: np.linalg.norm(pa[k] - pb[k]) / np.linalg.norm(pa[k]) for k in pa}
            worst = max(rel, key=rel.get)
            assert s.worst == worst
            assert s.worst_rel_l2 == pytest.approx(rel[worst], rel=1e-9)
            assert s.worst_max_abs == pytest.approx(np.max(np.abs(pa[worst] - pb[worst])), rel=1e-9)
            # the step's figures over all parameters stay beside it
            assert s.max_abs == pytest.approx(max(np.max(np.abs(pa[k] - pb[k])) for k in pa))
            total = np.sqrt(sum(np.sum((pa[k] - pb[k]) ** 2) for k in pa) /
                            sum(np.sum(pa[k] ** 2) for k in pa))
            assert s.rel_l2 == pytest.approx(total, rel=1e-9)
    js = tracediff.to_json(r)["optimizer_steps"]
    s0 = diff[0]
    row = next(x for x in js if x["step"] == s0.step)
    assert row["worst"] == s0.worst and row["worst_rel_l2"] == s0.worst_rel_l2
    assert row["worst_max_abs"] == s0.worst_max_abs


def test_reports_show_the_worst_tensor_relative_l2(gru_steps):
    from tracediff.report import html, markdown, terminal

    _, _, r = gru_steps
    s0 = next(s for s in r.optimizer_steps if not s.bitwise_equal)
    from tracediff.report.numbers import fmt

    md = markdown.render(r)
    assert "worst parameter (relative L2)" in md
    assert f"`{s0.worst}` ({fmt(s0.worst_rel_l2)}, max abs {fmt(s0.worst_max_abs)})" in md
    page = html.render(r)
    assert "worst parameter (relative L2)" in page
    # the per-step plot's tooltip names it too
    assert f"(worst {s0.worst} ({fmt(s0.worst_rel_l2)}, max abs {fmt(s0.worst_max_abs)})), " \
        "all parameters: relative L2" in page
    text = render_terminal(terminal.print_locate, r, verbose=True)
    assert f"{s0.worst} (relative L2 {terminal._fmt(s0.worst_rel_l2)}" in text


# -- source: library frame <- user frame -------------------------------------------------------

def _line_of(func, needle):
    """The file and line number of the first line of FUNC's source containing NEEDLE."""
    import inspect

    lines, start = inspect.getsourcelines(func)
    k = next(i for i, text in enumerate(lines) if needle in text)
    return os.path.realpath(inspect.getsourcefile(func)), start + k


def _lib_file(lib):
    path, _, line = lib.rpartition(":")
    return os.path.realpath(path), int(line)


@pytest.fixture(scope="module")
def gru_a(gru_steps):
    a, _, _ = gru_steps
    with tracediff.load(a) as t:
        yield t


def test_torch_op_inside_torch_nn_names_the_user_line_and_the_library_frame(gru_a):
    from torch import nn

    t = gru_a
    tab = t.events_table()
    # the head's addmm runs inside nn.Linear.forward, called by the script's `self.head(h)`
    i = next(i for i in range(len(t)) if tab["op"][i] == "aten::addmm" and
             tab["name_stack"][i] == "head" and tab["phase"][i] == "forward")
    ev = t.event(i)
    assert ev["source"] == "torch_gru_adam.py:21" == tab["source"][i]
    assert _lib_file(ev["lib_source"]) == _line_of(nn.Linear.forward, "F.linear(")
    assert tab["lib_source"][i] == ev["lib_source"]
    # `tracediff show` prints both, and its JSON has both
    # (wide: a site-packages path longer than this machine's must not wrap)
    out = run_cli("show", t.path, str(i), check=True, env={"COLUMNS": "1000"}).stdout
    assert f"source: {ev['lib_source']} ← torch_gru_adam.py:21" in out
    js = json.loads(run_cli("show", t.path, str(i), "--json", check=True).stdout)
    assert js["source"] == "torch_gru_adam.py:21" and js["lib_source"] == ev["lib_source"]
    # the trace holds the lines of both: the user's and the library's
    user = t.source_lines(ev["source"])
    assert dict(user["lines"])[21].strip() == "return self.head(h)"
    lib = t.source_lines(ev["lib_source"])
    assert "F.linear(" in dict(lib["lines"])[lib["line"]]
    # an op of the script's own code has no library frame
    j = next(i for i in range(len(t)) if tab["op"][i] == "aten::zeros")
    assert tab["source"][j] == "torch_gru_adam.py:18" and tab["lib_source"][j] == ""


def test_reports_show_library_frame_beside_the_user_line(gru_steps):
    from torch import nn

    from tracediff.report import html, markdown, terminal

    _, _, r = gru_steps
    a = r.first_difference.a
    assert a.source == "torch_gru_adam.py:20"   # GRUCell(x, h) in the script
    path, line = _line_of(nn.GRUCell.forward, "_VF.gru_cell(")
    assert _lib_file(a.lib_source) == (path, line)
    shown = f"{a.lib_source} ← torch_gru_adam.py:20"
    assert shown in render_terminal(terminal.print_locate, r)
    assert shown in markdown.render(r) and shown in html.render(r)
    js = tracediff.to_json(r)["first_difference"]["a"]
    assert js["source"] == "torch_gru_adam.py:20" and js["lib_source"] == a.lib_source


def test_flax_linen_op_names_the_user_line_and_the_flax_frame(recorded):
    from flax.linen import linear

    path = recorded("flax_dense.py", "--mlp", "--jit")
    with tracediff.load(path) as t:
        tab = t.events_table()
        i = next(i for i in range(len(t)) if tab["op"][i] == "dot_general" and
                 "fc0" in tab["name_stack"][i])
        ev = t.event(i)
        assert ev["source"] == "flax_dense.py:43"   # h = nn.Dense(w, name=f"fc{i}")(h)
        lib_path, lib_line = _lib_file(ev["lib_source"])
        assert lib_path == os.path.realpath(linear.__file__)   # flax's Dense, not jax
        lines = t.source_lines(ev["lib_source"])
        assert "dot_general" in dict(lines["lines"])[lib_line]
        # the user's line is stored too, for the "LIB ← USER" source string
        assert "nn.Dense(w" in dict(t.source_lines(ev["source"])["lines"])[43]


def test_report_code_context_is_the_user_line_from_the_trace_or_source_dir(gru_steps):
    """The culprit ran inside torch.optim (adam.py ← the script's opt.step()): the code
    shown is the user's line, from the trace, and from --source-dir when asked."""
    from tracediff.report import markdown
    from tracediff.report.context import report_context

    _, _, r = gru_steps
    f = r.first_beyond_tolerance
    assert f.a.lib_source and f.a.source == "torch_gru_adam.py:39"
    assert os.path.basename(_lib_file(f.a.lib_source)[0]) == "adam.py"
    for source_dir in (None, FIXTURES):
        ctx = report_context(r, source_dir)
        assert ctx.source["found"] and ctx.source["line"] == 39, ctx.source
        assert "opt.step()" in dict(ctx.source["lines"])[39]
        assert ctx.source["origin"] == ("trace" if source_dir is None else "local")
        assert "opt.step()" in markdown.render(r, ctx)


def test_a_hostile_library_frame_is_shown_as_text(gru_steps, tmp_path):
    """A stranger's trace may put terminal escapes and markup in the LIB part: every report
    shows them as text (untrusted.py)."""
    import shutil

    import h5py

    from tracediff.report import html, markdown, terminal

    a, b, r = gru_steps
    ea = r.first_difference.a.index
    bad = str(tmp_path / "a.h5")
    shutil.copyfile(a, bad)
    payload = "lib\x1b[2J[bold red]x[/]<b>`|"
    with h5py.File(bad, "r+") as f:
        n = int(f.attrs["committed_strings"])
        f["strings"].resize((n + 1,))
        f["strings"][n] = f"{payload}.py:1 ← torch_gru_adam.py:20"
        f.attrs["committed_strings"] = n + 1
        ev = f["events"][()]
        ev["source"][ea] = n
        f["events"][...] = ev
    res = tracediff.locate(bad, b, explain=False)
    got = res.first_difference.a
    assert got.source == "torch_gru_adam.py:20" and got.lib_source == payload + ".py:1"
    text = render_terminal(terminal.print_locate, res, verbose=True)
    assert "\x1b" not in text and r"lib\x1b[2J[bold red]x[/]" in text
    md = markdown.render(res)
    # a code span (HTML inside it is text), the pipe escaped for the table cell
    assert "\x1b" not in md
    assert r"``lib\x1b[2J[bold red]x[/]<b>`\|.py:1 ← torch_gru_adam.py:20``" in md
    page = html.render(res)
    assert "\x1b" not in page and "<b>`|" not in page and "&lt;b&gt;" in page
    shown = run_cli("show", bad, str(ea), check=True).stdout
    assert "\x1b" not in shown and "[bold red]x[/]" in shown.replace("\n", "")


def test_a_slice_keeps_the_lines_of_both_frames(gru_a, tmp_path):
    from tracediff.trace.slice import write_slice

    t = gru_a
    tab = t.events_table()
    i = next(i for i in range(len(t)) if tab["op"][i] == "aten::addmm" and tab["name_stack"][i] == "head")
    out = str(tmp_path / "cut.h5")
    write_slice(t.path, i, out, hops=1)
    with tracediff.load(out) as s:
        st = s.events_table()
        j = next(j for j in range(len(s)) if st["op"][j] == "aten::addmm" and st["name_stack"][j] == "head")
        assert (st["source"][j], st["lib_source"][j]) == (tab["source"][i], tab["lib_source"][i])
        assert s.source_lines(st["source"][j])["lines"] and s.source_lines(st["lib_source"][j])["lines"]


_TINY_LIBRARY = '''\
import jax.numpy as jnp


def layer(x, w):
    return jnp.tanh(x @ w)
'''

_TINY_SCRIPT = '''\
import jax
import jax.numpy as jnp
import tinylayers


@jax.jit
def model(x, w):
    return tinylayers.layer(x, w) * 2.0


x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
print(model(x, jnp.linspace(0.5, -0.5, 8).reshape(4, 2)))
'''


def test_a_library_installed_with_pip_target_is_a_library_frame(tmp_path):
    """A package installed with `pip install --target DIR` and put on PYTHONPATH (a cluster's
    shared folder, the TPU machine's extra packages) lies outside every site-packages; its
    frames are still library frames: the op is named at the user's line, the library's line
    beside it (seen on the TPU host, where flax's Dense was named as the user's line)."""
    import subprocess
    import sys

    from .helpers import record, script_env

    src, lib, work = tmp_path / "src", tmp_path / "lib", tmp_path / "work"
    (src / "tinylayers").mkdir(parents=True)
    (src / "tinylayers" / "__init__.py").write_text(_TINY_LIBRARY)
    (src / "pyproject.toml").write_text('[project]\nname = "tinylayers"\nversion = "1.0"\n'
                                        '[build-system]\nrequires = ["setuptools"]\n'
                                        'build-backend = "setuptools.build_meta"\n')
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", str(lib), str(src)],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode != 0:
        pytest.skip("pip cannot build a local package here: " + pip.stderr.strip()[-200:])
    assert list(lib.glob("tinylayers-*.dist-info")) and (lib / "tinylayers").is_dir()
    work.mkdir()
    (work / "script.py").write_text(_TINY_SCRIPT)
    out = str(work / "t.h5")
    record(str(work / "script.py"), out, env=script_env({"PYTHONPATH": str(lib)}))
    with tracediff.load(out) as t:
        tab = t.events_table()
        ev = t.event(next(i for i in range(len(t)) if tab["op"][i] == "tanh"))
    assert ev["source"] == "script.py:8", ev     # return tinylayers.layer(x, w) * 2.0
    assert ev["lib_source"].startswith(str(lib / "tinylayers" / "__init__.py")), ev
