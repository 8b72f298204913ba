"""One typed result, every renderer: the terminal, Markdown, HTML and JSON render the same
`LocateResult` (and `tracediff explain`'s terminal and JSON the same `Analysis`) and show
the same op, module, source line and numbers; metrics are real floats; a chain collapsed
into hops and gaps renders everywhere; no renderer takes a dict.

The traces are two in-process recordings of a small torch module whose `pow` exponent
differs in the second run (a deliberate perturbation of one op: its inputs are bitwise
equal, its outputs differ beyond tolerance), followed by a long chain of multiplies so
that the chain from the origin is collapsed with gaps.
"""

import dataclasses
import json
import math
import re

import pytest

import tracediff
from tracediff.diff.locate import locate_with_analysis, open_differ
from tracediff.diff.profile import event_profile
from tracediff.diff.result import (Analysis, EventRef, Finding, Gap, Hop, LocateResult, Metrics,
                                   Replay)
from tracediff.report import html as html_report
from tracediff.report import markdown
from tracediff.report.context import report_context
from tracediff.report.explain_terminal import print_analysis
from tracediff.report.json_report import analysis_json, build
from tracediff.report.terminal import print_locate
from tracediff.trace.reader import Trace

from .helpers import line_in, render_terminal

torch = pytest.importorskip("torch")

HOPS = 14   # multiplies after the perturbed op: more than a collapsed chain shows


class Block(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        y = torch.pow(x, self.p)   # POW_LINE
        for _ in range(HOPS):
            y = y * 1.5
        return y


class Net(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.block = Block(p)

    def forward(self, x):
        return self.block(x).sum()


def _line(marker):
    return line_in(__file__, marker)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract")
    x = torch.linspace(0.5, 2.0, 16)
    paths = []
    for name, p in (("a", 3.0), ("b", 3.001)):
        path = str(folder / f"{name}.h5")
        with tracediff.record(path, frameworks=("torch",)):
            Net(p)(x)
        paths.append(path)
    a, b = paths
    result, analysis = locate_with_analysis(a, b)
    with Trace(a) as ta, Trace(b) as tb:
        profile = event_profile(open_differ(ta, tb)[0])
    return a, b, result, analysis, profile



def _renderings(result, profile):
    ctx = report_context(result)
    return {"terminal": render_terminal(print_locate, result, verbose=True),
            "markdown": markdown.render(result, ctx),
            "html": html_report.render(result, ctx, profile),
            "json": json.dumps(build(result))}


def _walk(obj):
    """Every value inside a result (dataclasses, lists, dicts)."""
    yield obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)


def test_the_culprit_is_the_perturbed_op(pair):
    _, _, result, _, _ = pair
    f = result.first_beyond_tolerance
    assert result.verdict == "diverged" and isinstance(f, Finding)
    assert isinstance(f.a, EventRef) and f.a.op == "aten::pow.Tensor_Scalar"
    assert f.a.name_stack == "block" and f.a.source == f"test_result_contract.py:{_line('POW_LINE')}"
    assert f.inputs_match is True
    # the typed fields and the dict-style reads of earlier versions agree
    assert f.a["op"] == f.a.op and f.metrics["max_ulp"] == f.metrics.max_ulp


def test_metrics_are_real_floats(pair):
    _, _, result, analysis, _ = pair
    f = result.first_beyond_tolerance
    assert isinstance(f.metrics, Metrics)
    for m in (f.metrics, *(v.metrics for v in f.values), *(h.metrics for h in analysis.chain.hops)):
        assert isinstance(m.max_rel, float) and isinstance(m.max_abs, float)
        assert isinstance(m.max_ulp, float)
    assert f.metrics.max_rel > 1e-5 and not f.metrics.within_tolerance
    # no value anywhere in the result or the analysis is a number written as a string
    for v in _walk((result, analysis)):
        assert v not in ("inf", "-inf", "nan"), v


def test_every_renderer_shows_the_same_finding(pair):
    _, _, result, _, profile = pair
    f = result.first_beyond_tolerance
    out = _renderings(result, profile)
    rel = f"{f.metrics.max_rel:.3g}"
    # the terminal writes 11624, the documents 11,624
    ulps = {"terminal": f"{f.metrics.max_ulp:.0f}", "markdown": f"{f.metrics.max_ulp:,.0f}",
            "html": f"{f.metrics.max_ulp:,.0f}"}
    for name, text in out.items():
        assert f.a.op in text, name
        assert f"test_result_contract.py:{_line('POW_LINE')}" in text, name
        assert "block" in text, name
        if name != "json":
            assert rel in text, (name, rel)
            assert re.search(rf"max (ulp|ULP distance)(\W|td)+{ulps[name]}\b", text), name
    doc = json.loads(out["json"])["first_beyond_tolerance"]
    assert doc["a"]["op"] == f.a.op and doc["a"]["name_stack"] == f.a.name_stack
    assert doc["metrics"]["max_rel"] == f.metrics.max_rel
    assert doc["metrics"]["max_ulp"] == f.metrics.max_ulp
    assert doc["inputs_match"] is True


def test_an_infinite_metric_is_inf_everywhere_and_a_string_only_in_json(pair):
    _, _, result, _, profile = pair
    f = result.first_beyond_tolerance
    worse = dataclasses.replace(f, metrics=dataclasses.replace(f.metrics, max_rel=math.inf))
    result = dataclasses.replace(result, first_beyond_tolerance=worse, first_difference=worse)
    out = _renderings(result, profile)
    assert "max rel inf" in out["terminal"]
    assert "| max relative difference | inf |" in out["markdown"]
    assert "<td>max relative difference</td><td>inf</td>" in out["html"]
    assert json.loads(out["json"])["first_beyond_tolerance"]["metrics"]["max_rel"] == "inf"
    assert result.first_beyond_tolerance.metrics.max_rel == math.inf


def test_a_collapsed_chain_renders_its_gaps(pair):
    _, _, result, analysis, profile = pair
    chain = result.chain
    gaps = [h for h in chain if isinstance(h, Gap)]
    hops = [h for h in chain if isinstance(h, Hop)]
    assert gaps and hops[0].role.startswith("origin") and "last" in hops[-1].role
    # every hop of the full chain is either shown or counted in a gap
    assert len(hops) + sum(g.hops for g in gaps) == len(analysis.chain.hops) == HOPS + 2
    out = _renderings(result, profile)
    for g in gaps:
        text = f"... {g.hops} more hops"
        assert text in out["terminal"] and text in out["markdown"] and text in out["html"]
        assert text in json.loads(out["json"])["chain"]
    # short terminal form: the hops with a role, the others counted
    short = render_terminal(print_locate, result)
    line = next(ln for ln in short.splitlines() if ln.startswith("chain: "))
    counted = sum(int(n) for n in re.findall(r"\((\d+) hops\)", line))
    assert counted == len(analysis.chain.hops) - len([h for h in hops if h.role])
    # explain's table shows the same gaps
    table = render_terminal(print_analysis, analysis)
    for g in gaps:
        assert f"... {g.hops} more hops" in table


def test_explain_terminal_and_json_render_the_same_analysis(pair):
    _, _, result, analysis, _ = pair
    assert isinstance(analysis, Analysis) and isinstance(result.explain, Replay)
    text = render_terminal(print_analysis, analysis)
    doc = analysis_json(analysis)
    o = analysis.origin
    assert doc["origin"]["a"]["op"] == o.a.op and doc["origin"]["a"]["source"] == o.a.source
    assert f"origin: torch op {o.a.op} (a #{o.a.index}" in text and o.a.source in text
    assert doc["replay"]["verdict"] == analysis.replay.verdict
    assert f"replay verdict: {analysis.replay.verdict}" in text
    assert doc["summary"] == analysis.summary and f"summary: {analysis.summary}" in text
    # locate's short verdict is made from the same analysis
    assert result.explain.event == f"{o.a.op} (a #{o.a.index})"
    assert build(result)["explain"]["event_index"] == o.a.index


def test_no_renderer_takes_a_dict(pair):
    _, _, result, analysis, profile = pair
    data = tracediff.to_json(result)
    ctx = report_context(result)
    with pytest.raises(TypeError, match="LocateResult"):
        markdown.render(data, ctx)
    with pytest.raises(TypeError, match="LocateResult"):
        html_report.render(data, ctx, profile)
    with pytest.raises(TypeError, match="LocateResult"):
        render_terminal(print_locate, data)
    with pytest.raises(TypeError, match="LocateResult"):
        build(data)
    with pytest.raises(TypeError, match="ReportContext"):
        markdown.render(result, {"commands": []})
    with pytest.raises(TypeError, match="Analysis"):
        render_terminal(print_analysis, analysis_json(analysis))
    with pytest.raises(TypeError, match="Analysis"):
        analysis_json(analysis_json(analysis))
    assert isinstance(result, LocateResult)


def test_every_renderer_names_the_differing_argument(pair):
    # the perturbation is the pow's scalar exponent: the finding says so, everywhere
    _, _, result, _, profile = pair
    f = result.first_beyond_tolerance
    assert [(d.name, d.a, d.b) for d in f.arguments] == [("exponent", "3.0", "3.001")]
    out = _renderings(result, profile)
    for name in ("terminal", "markdown", "html"):
        assert "arguments differ" in out[name] and "exponent 3.0 vs 3.001" in out[name], name
    doc = json.loads(out["json"])["first_beyond_tolerance"]
    assert doc["arguments_differ"] == [{"name": "exponent", "a": "3.0", "b": "3.001"}]
