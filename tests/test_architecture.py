"""The layers of docs/architecture.md, checked on the source: every import (function-level
ones too) goes to the same layer or below, and no modules import each other in a circle."""

import ast
import functools
import os

from .helpers import ROOT

PKG = os.path.join(ROOT, "tracediff")

# lowest first; a module may import its own layer and the layers before it
LAYERS = [
    {"tracediff.errors", "tracediff._version", "tracediff.untrusted", "tracediff.shell"},
    {"tracediff.trace"},
    {"tracediff.capture", "tracediff.diff"},
    {"tracediff.report"},
    {"tracediff.runner", "tracediff.api", "tracediff.demo", "tracediff.pytest_plugin",
     "tracediff.cli", "tracediff.__main__", "tracediff", "tracediff.examples"},
]
# siblings in one layer that must stay apart: the differ never needs a recorder
APART = [("tracediff.diff", "tracediff.capture"), ("tracediff.capture", "tracediff.diff")]


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


def _layer(name):
    best = None
    for i, layer in enumerate(LAYERS):
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


def test_no_import_circles():
    graph = _graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
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
    # a package's __init__ re-exporting its own modules is not a circle of concerns
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, f"import circles: {cycles}"


def test_the_checker_sees_function_level_and_relative_imports():
    graph = _graph()
    assert "tracediff.diff.differ" in graph["tracediff.diff.locate"]
    assert "tracediff.trace.reader" in graph["tracediff"]          # inside load()
    assert "tracediff.report.json_report" in graph["tracediff"]    # inside to_json()
