"""Reports: Markdown and HTML of the typed locate result, the per-event profile, the terminal
report's --verbose/--quiet/NO_COLOR. Synthetic traces for the details, the session JAX
recordings (XLA SSE4.2, one-ULP tanh) end to end."""

import dataclasses
import html.parser
import json
import os
import re

import numpy as np
import pytest

import tracediff
from tracediff.diff.differ import Differ
from tracediff.diff.profile import event_profile, locate_with_profile
from tracediff.diff.result import EventRef, Finding, Gap, Hop, LocateResult, Metrics, Replay
from tracediff.report import html as html_report
from tracediff.report import markdown
from tracediff.report.context import report_context
from tracediff.report.numbers import fmt_bytes
from tracediff.report.source_context import source_context
from tracediff.trace.reader import Trace
from tracediff.untrusted import md_text

from . import synth
from .conftest import GRU_STEPS
from .helpers import run_cli

TRAIN_PY = "\n".join(f"line_{i} = {i}" for i in range(1, 20)) + "\n"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Two 3-step synthetic runs: b has aten::tanh of step 1 scaled by 1.001 (beyond tolerance);
    the manifests point at a train.py that exists, and b sets an env variable."""
    folder = tmp_path_factory.mktemp("reports")
    script = folder / "train.py"
    script.write_text(TRAIN_PY)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    ev_a = synth.mlp_events(x, w, steps=3)
    ev_b = synth.mlp_events(x, w, steps=3)
    for e in ev_b:
        if e["op"] == "aten::tanh" and e["step"] == 1:
            e["outs"] = [e["outs"][0] * np.float32(1.001)]
    script_meta = {"name": "train.py", "sha256": "0" * 64, "path": str(script),
                   "argv": [str(script), "--steps", "3"]}
    man_a = synth.manifest(script=script_meta)
    man_b = synth.manifest(script=script_meta)
    man_b["env"] = {**man_b["env"], "OMP_NUM_THREADS": "1"}
    a = synth.write(str(folder / "a.h5"), ev_a, man_a, source_dir=folder)
    b = synth.write(str(folder / "b.h5"), ev_b, man_b, source_dir=folder)
    return a, b, folder


class _Html(html.parser.HTMLParser):
    """Collects tags and checks that every non-void element is closed in order."""

    VOID = {"meta", "input", "br", "hr", "img", "link", "col", "source", "path", "line",
            "circle", "rect"}

    def __init__(self):
        super().__init__()
        self.stack, self.tags, self.errors, self.attrs = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()


def _parse(text):
    p = _Html()
    p.feed(text)
    p.close()
    return p


def _md_tables_ok(text):
    """Every Markdown table has the same number of cells in each row."""
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    blocks, cur = [], []
    for ln in text.splitlines():
        if ln.startswith("|"):
            cur.append(ln)
        elif cur:
            blocks.append(cur)
            cur = []
    for block in blocks:
        counts = {len(re.findall(r"(?<!\\)\|", ln)) for ln in block}
        assert len(counts) == 1, block
        assert re.fullmatch(r"\|(---\|)+", block[1]), block[1]
    return bool(rows)


# -- profile ---------------------------------------------------------------------------------

def test_profile_agrees_with_the_exact_comparison(synthetic):
    a, b, _ = synthetic
    with Trace(a) as ta, Trace(b) as tb:
        d = Differ(ta, tb)
        p = event_profile(d)
        assert len(p["a"]) == len(ta)
        for k in range(len(p["a"])):
            r = d.compare_event(int(p["a"][k]), int(p["b"][k]))
            if r["bitwise_equal"]:
                assert p["max_rel"][k] == 0 and p["bitwise_equal"][k] and not p["beyond"][k]
            else:
                assert p["max_rel"][k] == pytest.approx(float(r["metrics"]["max_rel"]), rel=1e-12)
                assert bool(p["beyond"][k]) == (not r["within_tolerance"])
        tanh = [k for k in range(len(p["a"])) if p["op"][k] == "aten::tanh"]
        assert [bool(p["beyond"][k]) for k in tanh] == [False, True, False]
        assert p["max_rel"][tanh[1]] == pytest.approx(1e-3, rel=1e-2)


# -- Markdown --------------------------------------------------------------------------------

def test_markdown_has_every_section(synthetic):
    a, b, folder = synthetic
    result = tracediff.locate(a, b)
    text = markdown.render(result, report_context(result))
    assert text.startswith("# tracediff report\n")
    summary = text.split("\n\n")[1]
    assert "diverge" in summary and "`aten::tanh`" in summary and "step 1" in summary
    for head in ("## First divergence beyond tolerance", "## Optimizer steps",
                 "## Environment differences", "## Reproduce", "## Traces to attach"):
        assert head in text
    # the user's line with two lines of context, marked
    assert "```python\n  9  line_9 = 9\n 10  line_10 = 10\n>11  line_11 = 11\n" in text
    assert "| env | `env.OMP_NUM_THREADS` | `(unset)` | `1` |" in text
    assert "OMP_NUM_THREADS=1 tracediff record -o b.h5 train.py --steps 3" in text
    assert "tracediff locate a.h5 b.h5" in text
    size = os.path.getsize(a)
    assert f"`a.h5` — {fmt_bytes(size)}, 15 events" in text
    assert "introduced here" in text
    assert _md_tables_ok(text)
    # the replay verdict and the chain appear exactly when the result carries them
    assert ("## Replay verdict" in text) == (result.explain is not None)
    assert ("## From origin to outputs" in text) == bool(result.chain)
    text = markdown.render(dataclasses.replace(result, explain=None, chain=None))
    assert "Replay verdict" not in text and "From origin to outputs" not in text


def test_markdown_and_html_render_explain_and_chain_when_present(synthetic):
    a, b, _ = synthetic
    result = tracediff.locate(a, b)
    origin = result.first_beyond_tolerance.a
    result = dataclasses.replace(
        result,
        explain=Replay(verdict="this machine reproduces b", event="aten::tanh (a #7)",
                       summary="the float64 replay is 1 ULP from a", a_ulp_from_exact=1.0),
        chain=[Hop(a=origin, b=7, metrics=Metrics(max_rel=1e-3), input_rel=0.0,
                   amplification=None, role="origin,first_beyond_tolerance"),
               Gap(3),
               Hop(a=EventRef(index=9, op="aten::sum", step=1, source="train.py:12"), b=9,
                   metrics=Metrics(max_rel=2e-3), input_rel=1e-3, amplification=2.0,
                   role="last")])
    text = markdown.render(result, report_context(result))
    assert "## Replay verdict\n\n**this machine reproduces b**\n\nthe float64 replay is 1 ULP" in text
    assert "| a ulp from exact | 1 |" in text
    assert "## From origin to outputs" in text
    assert "1. `aten::tanh` (event #7, step 1, `train.py:11`) max rel 0.001 — **origin, first " \
           "beyond tolerance**" in text
    assert "2. ... 3 more hops" in text
    assert "3. `aten::sum` (event #9, step 1, `train.py:12`) max rel 0.002, amplified x2 — " \
           "**last differing event**" in text
    page = html_report.render(result, report_context(result))
    assert not _parse(page).errors
    assert "<p><b>this machine reproduces b</b></p>" in page
    assert "<li><code>aten::sum</code> (event #9" in page and "<b>last differing event</b>" in page


def test_source_context_is_the_recorded_lines(tmp_path):
    """A local file, even the script's, is never read without a source folder."""
    (tmp_path / "x.py").write_text("a\nb\nc\n")
    manifest = {"script": {"path": str(tmp_path / "x.py"), "name": "x.py"}}
    assert source_context("x.py:3", None, None, manifest) == {
        "file": "x.py", "line": 3, "lines": [], "found": False, "origin": None, "note": None}
    ctx = source_context("x.py:1", {"lines": [(1, "a"), (2, "b")], "sha256": None})
    assert ctx["lines"] == [(1, "a"), (2, "b")] and ctx["found"] and ctx["origin"] == "trace"
    assert source_context("no line number") is None


def test_match_report_says_identical(synthetic):
    a, _, _ = synthetic
    same = tracediff.locate(a, a)
    text = markdown.render(same, report_context(same))
    assert "bitwise identical in every compared value" in text and "**Verdict: MATCH**" in text
    assert "The recorded environments are identical." in text
    result, profile = locate_with_profile(a, a)
    page = html_report.render(result, report_context(result), profile)
    assert not _parse(page).errors and "MATCH" in page
    assert "Every aligned event is bitwise equal." in page and "culprit:" not in page


# -- HTML ------------------------------------------------------------------------------------

def test_html_is_self_contained_and_well_formed(synthetic):
    a, b, _ = synthetic
    result, profile = locate_with_profile(a, b)
    page = html_report.render(result, report_context(result), profile)
    p = _parse(page)
    assert not p.errors and p.stack == [], (p.errors, p.stack)
    assert page.startswith("<!DOCTYPE html>")
    # nothing from the network: no external scripts, styles, images or fonts
    for tag, attrs in p.attrs:
        for key in ("src", "href"):
            assert not attrs.get(key), (tag, attrs)
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "@import" not in page
    assert p.tags.count("svg") == 2      # per event, per optimizer step
    assert len(page) < 200_000
    # culprit marked on the plot and highlighted in the event table
    culprit = result.first_beyond_tolerance.a["index"]
    assert f"culprit: aten::tanh #{culprit}" in page
    assert re.search(r'<tr class="culprit"><td class="num">%d</td>' % culprit, page)
    # searchable tables: a filter box bound to each table, and the script doing it
    for tid in ("events", "steps", "env"):
        assert f'data-table="{tid}"' in page and f'<table id="{tid}">' in page
    assert "addEventListener('input'" in page
    assert "OMP_NUM_THREADS" in page and "line_11 = 11" in page


def test_trace_strings_cannot_inject_markup(synthetic, tmp_path):
    a, b, _ = synthetic
    result, profile = locate_with_profile(a, b)
    ctx = report_context(result)
    evil = '<img src=x onerror="alert(1)">`|'
    result.first_beyond_tolerance.a.op = evil
    result.first_beyond_tolerance.a.name_stack = "</table><script>alert(2)</script>"
    result.env_diff.append({"key": "env.X", "category": "env", "a": None, "b": "<b>x</b>"})
    profile = dict(profile, op=np.array([evil] * len(profile["op"]), dtype=object))
    page = html_report.render(result, ctx, profile)
    p = _parse(page)
    assert not p.errors
    assert "img" not in p.tags and p.tags.count("script") == 1      # only our own
    assert "&lt;img src=x" in page
    ctx.source = source_context(
        "s.py:2", {"lines": [(1, "x = 1"), (2, "y = '```'"), (3, "z = 3")]})
    text = markdown.render(result, ctx)
    assert "````python\n 1  x = 1\n>2  y = '```'\n 3  z = 3\n````" in text
    assert _md_tables_ok(text)


def test_html_plot_bins_long_runs():
    n = 10 * html_report.MAX_POINTS
    rel = np.zeros(n)
    rel[5000] = 1e-3
    profile = {"a": np.arange(n), "b": np.arange(n), "step": np.repeat(np.arange(10), n // 10),
               "max_rel": rel, "beyond": rel > 0, "bitwise_equal": rel == 0}
    mul = EventRef(index=5000, op="mul")
    result = LocateResult(path_a="a.h5", path_b="b.h5", verdict="diverged",
                          first_beyond_tolerance=Finding(level="tolerance", a=mul, b=mul))
    svg = html_report.event_plot(profile, result)
    assert "binned" in svg and "culprit: mul #5000" in svg
    assert len(svg) < 150_000
    assert svg.count("step ") >= 10


# -- CLI on real JAX divergences --------------------------------------------------------------

def test_report_cli_on_the_xla_isa_divergence(jax_gru, tmp_path):
    a, isa = jax_gru["a"][0], jax_gru["isa"][0]
    located = json.loads(run_cli("locate", a, isa, "--json").stdout)
    culprit = located["first_beyond_tolerance"]
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    for out in (md, page):
        proc = run_cli("report", a, isa, "-o", out)
        assert proc.returncode == 0, proc.stderr
        assert "verdict: diverged" in proc.stderr
    text = md.read_text()
    assert f"`{culprit['a']['op']}`" in text.split("\n\n")[1]
    assert "| env | `env.XLA_FLAGS` | `(unset)` | `--xla_cpu_max_isa=SSE4_2` |" in text
    assert f"XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 tracediff record -o {isa.name} " \
           f"jax_gru_expm_adam.py --steps {GRU_STEPS}" in text
    assert "nn.GRUCell(features=self.hidden)(h, x)" in text      # the user's line, read back
    assert _md_tables_ok(text)
    doc = page.read_text()
    assert not _parse(doc).errors
    assert f"culprit: {culprit['a']['op']} #{culprit['a']['index']}" in doc
    # stdout: Markdown, pipeable
    proc = run_cli("report", a, isa)
    assert proc.returncode == 0 and proc.stdout.startswith("# tracediff report")


def test_report_html_on_one_ulp_tanh_marks_the_first_bitwise_difference(jax_gru, tmp_path):
    a, bad = jax_gru["a"][0], jax_gru["tanh"][0]
    result, profile = locate_with_profile(a, bad)
    assert result.verdict == "match"
    doc = html_report.render(result, report_context(result), profile)
    idx = result.first_difference.a["index"]
    assert f"first bitwise difference: tanh #{idx}" in doc
    k = int(np.flatnonzero(profile["a"] == idx)[0])
    assert 0 < profile["max_rel"][k] < 1e-12 and not profile["beyond"].any()
    # everything before the enclosing compiled call (whose outputs differ too) is equal
    call = int(np.flatnonzero(profile["a"] == result.first_difference.call["a"])[0])
    assert call < k and not profile["bitwise_equal"][call]
    assert profile["bitwise_equal"][:call].all()


def test_report_errors_say_how_to_fix(synthetic, tmp_path):
    a, b, _ = synthetic
    proc = run_cli("report", a, b, "-o", tmp_path / "r.pdf")
    assert proc.returncode == 2 and "report.md or report.html" in proc.stderr
    proc = run_cli("report", a, tmp_path / "missing.h5")
    assert proc.returncode == 2 and "tracediff record -o" in proc.stderr
    proc = run_cli("report", a, b, "-o", tmp_path / "r.txt", "--format", "html")
    assert proc.returncode == 0 and (tmp_path / "r.txt").read_text().startswith("<!DOCTYPE html>")


# -- terminal --------------------------------------------------------------------------------

def test_locate_quiet_verbose_and_no_color(synthetic):
    a, b, _ = synthetic
    proc = run_cli("locate", "-q", a, b)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr == ""
    short = run_cli("locate", a, b)
    verbose = run_cli("locate", "-v", a, b)
    assert short.returncode == verbose.returncode == 1
    assert "line_11 = 11" in verbose.stdout and "line_11" not in short.stdout
    assert len(verbose.stdout) > len(short.stdout)
    colour = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-79]|9[0-7]|38;)")   # SGR foreground colours
    colored = run_cli("locate", a, b, env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert colour.search(colored.stdout)
    plain = run_cli("locate", a, b, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert not colour.search(plain.stdout) and "DIVERGED" in plain.stdout
    piped = run_cli("locate", a, b)            # not a terminal: no escape codes at all
    assert "\x1b[" not in piped.stdout
    proc = run_cli("locate", "-q", "-v", a, b)
    assert proc.returncode == 2 and "pick one" in proc.stderr


def test_a_pipe_in_a_trace_string_stays_in_its_markdown_table_cell(synthetic):
    """`|` in an op, a module path and an environment value: rendered as GitHub renders
    Markdown (CommonMark plus tables), every row keeps its header's cell count and each
    string is one cell, shown whole with its pipe."""
    from markdown_it import MarkdownIt

    a, b, _ = synthetic
    result = tracediff.locate(a, b)
    f = result.first_beyond_tolerance
    f.a.op, f.a.name_stack, f.b.op = "aten::a|b", "enc|dec", "aten::c||d"
    result.env_diff.append({"key": "env.PIPE", "category": "env", "a": "x|y", "b": None})
    text = markdown.render(result, report_context(result))
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables, cells, spans, in_table = [], [], [], False
    for t in tokens:
        if t.type == "table_open":
            tables.append([])
            in_table = True
        elif t.type == "table_close":
            in_table = False
        elif t.type == "tr_open":
            tables[-1].append(0)
        elif t.type in ("td_open", "th_open"):
            tables[-1][-1] += 1
        elif t.type == "inline":
            code = [c.content for c in t.children or () if c.type == "code_inline"]
            (cells if in_table else spans).extend(code)
    assert len(tables) >= 2
    for rows in tables:     # every row as many cells as the header
        assert len(set(rows)) == 1, rows
    for s in ("enc|dec", "aten::c||d", "x|y"):        # table cells, whole
        assert s in cells, (s, cells)
    assert "aten::a|b" in spans


# -- a divergence that is only structural (issue 38) -------------------------------------------

@pytest.fixture(scope="module")
def inserted(recorded):
    """fixtures/torch_inserted_op.py plainly and with --insert: b has one extra multiply
    whose result feeds torch.sign, which comes out the same: no value differs."""
    return recorded.many({"a": ("torch_inserted_op.py", ()),
                          "b": ("torch_inserted_op.py", ("--insert",))})


@pytest.mark.parametrize("ext", ["md", "html"])
def test_report_of_a_divergence_that_is_only_structural(inserted, tmp_path, ext):
    """Before: "unexpected AttributeError: 'NoneType' object has no attribute 'a'", exit 2."""
    from .helpers import fixture_line

    out = tmp_path / f"report.{ext}"
    proc = run_cli("report", inserted["a"], inserted["b"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    line = fixture_line("torch_inserted_op.py", "x = x * 1.000001")
    head = text.split("First difference: an op only one run has")[0]
    # the summary names the op, its side and its line, and says no value differs
    assert "diverge in structure: the run recorded as b executed" in head
    assert "and the run recorded as a did not" in head
    assert "aten::mul.Tensor" in head and line in head and "aten::sign" in head
    assert "Every compared value is bitwise identical." in head
    section = f"only in b: aten::mul.Tensor at {line}"
    assert (md_text(section) if ext == "md" else section) + " (step 0, event #1 of b)" in text


def test_an_insufficient_coverage_names_even_a_one_op_unpaired_region(inserted, tmp_path):
    """a kept as metadata only (nothing can be compared) against b with its one extra
    multiply: the coverage is below the bar, so its lines name every unpaired region, the
    one-op one too (a sufficient coverage names only regions of more than one)."""
    from tracediff.report.analysis_lines import coverage_lines

    from .helpers import metadata_only_copy

    golden = metadata_only_copy(inserted["a"], tmp_path / "golden.h5")
    r = tracediff.locate(str(golden), inserted["b"], explain=False)
    assert not r.coverage.sufficient and [u.length for u in r.coverage.unpaired] == [1]
    lines = coverage_lines(r)
    head = "unpaired: 1 events of b from #1 (aten::mul.Tensor"
    assert any(x.startswith(head) for x in lines), lines
    full = tracediff.locate(inserted["a"], inserted["b"], explain=False)
    assert full.coverage.sufficient
    assert not any(x.startswith("unpaired:") for x in coverage_lines(full))
