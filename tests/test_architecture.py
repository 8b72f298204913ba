"""The layers of docs/architecture.md, checked on the source: every import (function-level
ones too) goes to the same layer or below, and no modules import each other in a circle;
inside diff/ the same for its subpackages (the pipeline); no class too long to read."""

import ast
import functools
import os

from .helpers import ROOT

PKG = os.path.join(ROOT, "tracediff")

# lowest first; a module may import its own layer and the layers before it
LAYERS = [
    {"tracediff.errors", "tracediff._version", "tracediff.untrusted", "tracediff.shell",
     "tracediff.outfile"},
    {"tracediff.trace"},
    {"tracediff.capture", "tracediff.diff"},
    {"tracediff.report"},
    {"tracediff.runner", "tracediff.term_watch", "tracediff.api", "tracediff.demo",
     "tracediff.pytest_plugin",
     "tracediff.cli", "tracediff.__main__", "tracediff", "tracediff.examples"},
]
# siblings in one layer that must stay apart: the differ never needs a recorder
APART = [("tracediff.diff", "tracediff.capture"), ("tracediff.capture", "tracediff.diff"),
         # each framework's capture is its own room: neither needs the other's recorder
         ("tracediff.capture.jax", "tracediff.capture.torch"),
         ("tracediff.capture.torch", "tracediff.capture.jax")]

# diff/ as a pipeline (issue #29), lowest first: the result types; value comparison; which
# event / name corresponds to which; the engine's parts, then the engine; the pairings
# beyond sequence alignment and the root cause, side by side; locate; then what runs locate
# many times or over a whole run. A module of diff/ in none of them fails the test.
DIFF_LAYERS = [
    {"tracediff.diff.result"},
    {"tracediff.diff.compare"},
    {"tracediff.diff.align", "tracediff.diff.nonfinite"},
    {"tracediff.diff.engine"},
    {"tracediff.diff.differ"},
    {"tracediff.diff.pairing", "tracediff.diff.explain"},
    {"tracediff.diff.coverage"},
    {"tracediff.diff.locate"},
    {"tracediff.diff.profile", "tracediff.diff.distributed", "tracediff.diff.confirm"},
]
DIFF_APART = [("tracediff.diff.pairing", "tracediff.diff.explain"),
              ("tracediff.diff.explain", "tracediff.diff.pairing"),
              ("tracediff.diff.profile", "tracediff.diff.distributed"),
              ("tracediff.diff.distributed", "tracediff.diff.profile")]

# A class longer than this is several concerns: split it (mixins or helper classes per
# concern). Counted from the `class` line to its last line, docstrings and comments included.
# No exceptions (issue 54 split the last ones: the recorders, the writer, the reader).
MAX_CLASS_LINES = 320
# A module longer than this is several rooms: make it a package, one module per concern.
MAX_MODULE_LINES = 600


def _modules():
    out = {}
    for folder, _, files in os.walk(PKG):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
            out[name] = path
    return out


def _imports(name, path, known):
    """Every tracediff module `name` imports, wherever the import statement is."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _layer(name, layers=LAYERS):
    best = None
    for i, layer in enumerate(layers):
        for prefix in layer:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    assert best is not None, f"{name} is in no layer of docs/architecture.md"
    return best


@functools.lru_cache(maxsize=None)
def _graph():
    """{module: the tracediff modules it imports}; parsed once for the module's tests
    (read-only: callers never change it)."""
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def test_imports_go_down_the_layers():
    bad = []
    for name, targets in _graph().items():
        (mine, my_prefix) = _layer(name)
        for t in targets:
            (theirs, their_prefix) = _layer(t)
            if theirs > mine or (my_prefix, their_prefix) in APART:
                bad.append(f"{name} -> {t}")
    assert not bad, "upward or sideways imports:\n" + "\n".join(sorted(bad))


def _circles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circles():
    cycles = _circles(_graph())
    # a package's __init__ re-exporting its own modules is not a circle of concerns
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, f"import circles: {cycles}"


def _diff_layer(name):
    """(index in DIFF_LAYERS, the part of diff/ a module belongs to: its subpackage, or
    itself at diff/'s top); the package's own __init__ (a docstring) is at the bottom."""
    return (0, name) if name == "tracediff.diff" else _layer(name, DIFF_LAYERS)


def _diff_unit(name):
    return _diff_layer(name)[1]


def test_diff_imports_go_down_the_pipeline():
    bad = []
    for name, targets in _graph().items():
        if not name.startswith("tracediff.diff"):
            continue
        (mine, my_unit) = _diff_layer(name)
        for t in targets:
            if not t.startswith("tracediff.diff"):
                continue
            (theirs, their_unit) = _diff_layer(t)
            if theirs > mine or (my_unit, their_unit) in DIFF_APART:
                bad.append(f"{name} -> {t}")
    assert not bad, "upward or sideways imports in diff/:\n" + "\n".join(sorted(bad))


def test_no_circles_between_diff_subpackages():
    units = {}
    for name, targets in _graph().items():
        if name.startswith("tracediff.diff."):
            mine = units.setdefault(_diff_unit(name), set())
            mine.update(_diff_unit(t) for t in targets if t.startswith("tracediff.diff.")
                        and _diff_unit(t) != _diff_unit(name))
    assert {"tracediff.diff.align", "tracediff.diff.explain", "tracediff.diff.differ"} <= set(units)
    assert not _circles(units), f"circles between diff/ subpackages: {_circles(units)}"


def _classes():
    """{dotted class name: lines from `class` to its last line}, nested classes too."""
    out = {}
    for name, path in _modules().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_class_too_long():
    long = {c: n for c, n in _classes().items() if n > MAX_CLASS_LINES}
    assert not long, (f"classes over {MAX_CLASS_LINES} lines (split them by concern): "
                      + ", ".join(f"{c} {n}" for c, n in sorted(long.items())))


def test_no_module_too_long():
    long = {}
    for name, path in _modules().items():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_MODULE_LINES:
            long[name] = n
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (make them packages, a module "
                      f"per concern): " + ", ".join(f"{m} {n}" for m, n in sorted(long.items())))


def test_the_frameworks_capture_rooms_are_packages_kept_apart():
    """capture/jax/ and capture/torch/ hold every framework's recorder; the rule above keeps
    them from importing each other, and no framework module is left at capture/'s top."""
    mods = _modules()
    assert {"tracediff.capture.jax", "tracediff.capture.torch"} <= set(mods)
    flat = [m for m in mods if m.count(".") == 2 and m.startswith("tracediff.capture.")
            and m.rsplit(".", 1)[1].startswith(("jax_", "torch_"))]
    assert not flat, f"framework modules outside their room: {flat}"


def test_the_checker_sees_function_level_and_relative_imports():
    graph = _graph()
    assert "tracediff.diff.differ" in graph["tracediff.diff.locate"]
    assert "tracediff.trace.reader" in graph["tracediff"]          # inside load()
    assert "tracediff.report.json_report" in graph["tracediff"]    # inside to_json()
    assert "tracediff.diff.explain.analysis" in graph["tracediff.diff.locate"]
    assert "tracediff.diff.compare.values" in graph["tracediff.diff.explain.verdict"]  # `..`
