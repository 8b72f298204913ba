"""A framework is captured when it is *loaded*, however it is loaded, and never lost
silently (issue #26, item 1).

transformers calls `importlib.util.find_spec("jax")` before `import jax`; the import
watcher used to drop its callback on that lookup, so the trace held 0 JAX events and
`record` said "trace written". The watcher's own cases run in this process on a real
package written to a temporary folder (real imports: find_spec then import,
`importlib.import_module`, an import inside a function, a library importing it, a lazy
module, a loader called by hand); the recordings run in fresh interpreters, where the
frameworks are not imported yet (the test zygotes import them before the script)."""

import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tracediff.capture import ImportWatcher
from tracediff.trace import schema
from tracediff.trace.reader import Trace

from .helpers import ROOT, run_cli, script_env

_COUNTER = [0]


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fresh watched package `tdw_<n>` (and a library `tdwlib_<n>` that imports it, and a
    lazy module `tdwlazy_<n>` that imports it on first attribute access)."""
    _COUNTER[0] += 1
    name = f"tdw_{os.getpid()}_{_COUNTER[0]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("from . import sub\nVALUE = sub.X * 2\n")
    (tmp_path / name / "sub.py").write_text("X = 21\n")
    (tmp_path / f"tdwlib_{name}.py").write_text(f"import {name}\nGOT = {name}.VALUE\n")
    (tmp_path / f"tdwlazy_{name}.py").write_text(textwrap.dedent(f'''
        import importlib
        def __getattr__(attr):
            return getattr(importlib.import_module("{name}"), attr)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    fired = []
    w = ImportWatcher({name: lambda: fired.append(sys.modules[name].VALUE)})
    w.install()
    yield name, w, fired
    w.uninstall()
    for m in [m for m in sys.modules if name in m]:
        del sys.modules[m]


def test_find_spec_then_import_fires_on_the_load(pkg):
    name, w, fired = pkg
    spec = importlib.util.find_spec(name)      # a lookup, as transformers does
    assert spec is not None and fired == []    # nothing loaded yet: nothing fired
    importlib.util.find_spec(name)             # twice
    mod = importlib.import_module(name)
    assert fired == [42] and mod.VALUE == 42   # once, after the module finished executing
    assert w.loaded_unwatched() == [] and w.late == []


def test_the_looked_up_spec_loaded_by_hand_fires(pkg):
    name, w, fired = pkg
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    assert fired == [42]
    assert spec.loader.is_package(name)        # the real loader's other methods still answer


def test_import_inside_a_function_library_and_lazy_module(pkg):
    name, w, fired = pkg
    lazy = importlib.import_module(f"tdwlazy_{name}")
    assert fired == []                          # the lazy module has not loaded it yet
    assert lazy.VALUE == 42 and fired == [42]
    lib = importlib.import_module(f"tdwlib_{name}")   # already loaded: nothing more
    assert lib.GOT == 42 and fired == [42]


def test_a_library_importing_it(pkg):
    name, w, fired = pkg

    def load():
        import importlib as il
        return il.import_module(f"tdwlib_{name}")

    assert load().GOT == 42 and fired == [42]


def test_loaded_outside_the_import_system(pkg):
    """A loader called by hand (no meta path): found loaded on the next import of anything,
    and named by `loaded_unwatched` when no import follows."""
    name, w, fired = pkg
    spec = importlib.machinery.PathFinder.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)               # its `from . import sub` runs while it loads
    assert fired == [] and w.loaded_unwatched() == [name]
    importlib.import_module(f"tdwlib_{name}")  # the next import, of anything
    assert fired == [42] and w.late == [name] and w.loaded_unwatched() == []



def test_a_module_still_importing_in_another_thread_is_not_loaded_yet(tmp_path, monkeypatch):
    """A module whose code is still running in one thread is in sys.modules already: an
    import of anything else in another thread (which checks sys.modules for modules loaded
    outside the import system) must not fire its callback early, only its own load does,
    once its code has finished."""
    import threading

    _COUNTER[0] += 1
    name = f"tdwslow_{os.getpid()}_{_COUNTER[0]}"
    gate = f"tdwgate_{name}"
    (tmp_path / f"{gate}.py").write_text("import threading\nstarted = threading.Event()\n"
                                         "go = threading.Event()\n")
    (tmp_path / f"{name}.py").write_text(f"import {gate}\n{gate}.started.set()\n"
                                         f"{gate}.go.wait(30)\nVALUE = 42\n")
    (tmp_path / f"tdwother_{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    fired = []
    w = ImportWatcher({name: lambda: fired.append(getattr(sys.modules[name], "VALUE", None))})
    w.install()
    try:
        gates = importlib.import_module(gate)
        loader = threading.Thread(target=importlib.import_module, args=(name,))
        loader.start()
        assert gates.started.wait(30)           # its code runs: in sys.modules, not done
        importlib.import_module(f"tdwother_{name}")   # another import, in this thread
        assert fired == [] and w.late == [] and w.loaded_unwatched() == []
        gates.go.set()
        loader.join(30)
        assert fired == [42] and w.late == []
    finally:
        w.uninstall()
        for m in [m for m in sys.modules if name in m]:
            del sys.modules[m]


SCRIPT = textwrap.dedent('''
    import importlib.util, json, sys
    assert importlib.util.find_spec("jax") is not None      # as transformers does
    assert importlib.util.find_spec("torch") is not None
    import jax.numpy as jnp
    import torch
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    y = torch.arange(6.0).reshape(2, 3)
    a = jnp.sin(x) * 2.0
    b = torch.sin(y) * 2.0
    json.dump({"jax": [float(v) for v in a.reshape(-1)],
               "torch": [float(v) for v in b.reshape(-1)]}, open(sys.argv[1], "w"))
''')


def _fresh_record(tmp_path, script, *args):
    """`tracediff record` in a fresh interpreter (no zygote: nothing imported before)."""
    path = tmp_path / "script.py"
    path.write_text(script)
    out = tmp_path / "t.h5"
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", str(out), str(path),
                           *map(str, args)], env=script_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    return proc, out


def test_find_spec_before_import_records_every_op(tmp_path):
    truth = tmp_path / "truth.json"
    proc, out = _fresh_record(tmp_path, SCRIPT, truth)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr
    want = json.loads(truth.read_text())
    with Trace(str(out)) as t:
        assert t.manifest["frameworks"]["captured"] == ["jax", "torch"] or \
            sorted(t.manifest["frameworks"]["captured"]) == ["jax", "torch"]
        assert "missed" not in t.manifest["frameworks"]
        ev = t.events
        got = {}
        for e in range(len(t)):
            fw = schema.FW_NAMES.get(int(ev["framework"][e]))
            op = t.string(ev["op"][e])
            if op in ("sin", "aten::sin"):
                got.setdefault(fw + ":sin", t.outputs(e)[0])
            if op in ("mul", "aten::mul.Tensor", "aten::mul.Scalar"):
                got.setdefault(fw + ":mul", t.outputs(e)[0])
        # both frameworks' ops, with the values the script printed
        assert set(got) == {"jax:sin", "jax:mul", "torch:sin", "torch:mul"}, got.keys()
        np.testing.assert_array_equal(np.ravel(got["jax:mul"]), np.float32(want["jax"]))
        np.testing.assert_array_equal(np.ravel(got["torch:mul"]), np.float32(want["torch"]))
    # one trace, both frameworks: locate compares them (no "holds torch" refusal)
    loc = run_cli("locate", out, "--json")
    assert loc.returncode == 0, loc.stdout + loc.stderr
    assert json.loads(loc.stdout)["verdict"] == "match"


MISSED = textwrap.dedent('''
    import importlib.machinery, importlib.util, sys
    # torch loaded by hand, outside the import system; nothing is imported after it
    spec = importlib.machinery.PathFinder.find_spec("torch")
    torch = importlib.util.module_from_spec(spec)
    sys.modules["torch"] = torch
    spec.loader.exec_module(torch)
    print(float((torch.ones(3) * 2).sum()))
''')


def test_a_framework_loaded_but_not_captured_is_said_and_never_a_match(tmp_path):
    proc, out = _fresh_record(tmp_path, MISSED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "6.0"
    assert "WARNING: the script loaded torch but the trace holds none of its operations" \
        in proc.stderr
    with Trace(str(out)) as t:
        assert t.manifest["frameworks"]["missed"] == ["torch"]
    # the trace against itself agrees on everything it holds, which is not the run
    loc = run_cli("locate", out, out)
    assert loc.returncode == 2, loc.stdout + loc.stderr
    assert "lacks torch, which its script loaded but the recording did not capture" in loc.stderr
    assert "Traceback" not in loc.stderr


def test_one_sided_native_libraries_are_no_environment_difference(recorded):
    """A Flax script and its torch port: JAX loads libjax and scipy's libraries, torch its
    own; between traces of different frameworks none of them is an environment difference."""
    paths = recorded.many({"flax": ("flax_dense.py", (), None),
                           "torch": ("torch_linear.py", (), None)})
    with Trace(str(paths["flax"])) as ta, Trace(str(paths["torch"])) as tb:
        la, lb = set(ta.manifest["libraries"]), set(tb.manifest["libraries"])
        assert la - lb and lb - la
    d = json.loads(run_cli("locate", paths["flax"], paths["torch"], "--json", "--no-explain").stdout)
    assert [e["key"] for e in d["env_diff"] if e["key"].startswith("libraries.")
            and (e["a"] is None or e["b"] is None)] == []
    assert {e["key"] for e in d["env_diff"]} >= {"frameworks.jax", "frameworks.torch"}
