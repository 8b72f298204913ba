"""pytest plugin: golden-trace checks in a test suite (registered as the `pytest11`
entry point `tracediff`, so installing tracediff enables it; or `-p tracediff.pytest_plugin`).

Fixtures:

* `tracediff_check(golden, script, *args, rtol=None, atol=None)`: records
  `python SCRIPT ARGS...` under `tracediff record` in a subprocess (a clean process, as
  in production) and compares it with the golden trace; the test fails with the
  terminal report when they diverge, or when the comparison is inconclusive (too little
  compared, `diff/coverage.py`). Returns the `LocateResult`.
* `tracediff_golden(golden, rtol=None, atol=None)`: a context manager recording the
  code inside the `with` block in the test process (`tracediff.record`) and comparing
  it with the golden trace when the block ends.

Relative golden paths are taken from the test file's folder. A missing golden, or one
with nothing to compare (no events, or only metadata-only values), fails the test with
the command that creates it; `pytest --tracediff-update-golden` (re)writes
every golden the selected tests use instead of comparing.

    def test_training_is_stable(tracediff_check):
        tracediff_check("goldens/train.h5", "train.py", "--steps", "2", rtol=1e-5)
"""

import contextlib
import io
import os
import subprocess
import sys

import pytest

UPDATE_OPTION = "--tracediff-update-golden"


def pytest_addoption(parser):
    group = parser.getgroup("tracediff", "tracediff golden traces")
    group.addoption(UPDATE_OPTION, action="store_true", default=False,
                    help="(Re)write the golden traces used by tracediff_check / "
                         "tracediff_golden instead of comparing with them.")


def _render(result):
    from rich.console import Console

    from .report.terminal import print_locate

    buf = io.StringIO()
    print_locate(result, console=Console(file=buf, no_color=True, width=110, highlight=False,
                                         soft_wrap=True))
    return buf.getvalue()


class _Golden:
    def __init__(self, request, tmp_path):
        self.update = request.config.getoption(UPDATE_OPTION)
        self.folder = os.path.dirname(str(request.node.fspath))
        self.tmp_path = tmp_path
        self.count = 0

    def path(self, golden):
        golden = os.fspath(golden)
        return golden if os.path.isabs(golden) else os.path.join(self.folder, golden)

    def new_trace(self):
        self.count += 1
        return os.path.join(str(self.tmp_path), f"tracediff-new-{self.count}.h5")

    def missing(self, golden, how):
        pytest.fail(f"tracediff: golden trace {golden} does not exist; create it with: "
                    f"pytest {UPDATE_OPTION} ({how})", pytrace=False)

    def usable(self, golden, how):
        """Fail the test when GOLDEN is missing or holds nothing to compare (a match
        against nothing would pass any run)."""
        from .diff.locate import nothing_to_compare
        from .errors import TraceError, one_line

        if not os.path.exists(golden):
            self.missing(golden, how)
        try:
            why = nothing_to_compare(golden)
        except TraceError as exc:
            pytest.fail(f"tracediff: golden trace {golden}: {one_line(exc)}", pytrace=False)
        if why:
            pytest.fail(f"tracediff: golden trace {golden} has nothing to compare ({why}); "
                        f"record it again with: pytest {UPDATE_OPTION} ({how})", pytrace=False)

    def compare(self, golden, new, rtol, atol):
        from .diff.locate import locate

        result = locate(golden, new, rtol=rtol, atol=atol)
        if result.verdict == "diverged":
            pytest.fail(f"tracediff: the run diverges from the golden trace {golden}\n\n"
                        f"{_render(result)}\nnew trace: {new}\n(if the new numbers are right: "
                        f"pytest {UPDATE_OPTION})", pytrace=False)
        if result.verdict == "inconclusive":   # a match on too little evidence is no pass
            pytest.fail(f"tracediff: inconclusive against the golden trace {golden}: nothing "
                        f"differs in what was compared, but too little was compared\n\n"
                        f"{_render(result)}\nnew trace: {new}", pytrace=False)
        return result


@pytest.fixture
def tracediff_check(request, tmp_path):
    """`tracediff_check(golden, script, *args, rtol=None, atol=None, loops="opaque",
    env=None)`: record SCRIPT in a subprocess and compare with GOLDEN (see the module
    docstring). Returns the `LocateResult`; None when the golden was (re)written."""
    g = _Golden(request, tmp_path)

    def check(golden, script, *args, rtol=None, atol=None, loops="opaque", env=None):
        golden = g.path(golden)
        script = g.path(script)
        if not os.path.isfile(script):
            pytest.fail(f"tracediff: no such script {script}", pytrace=False)
        if not g.update:
            g.usable(golden, f"records {os.path.basename(script)} into it")
        target = golden if g.update else g.new_trace()
        if g.update:
            os.makedirs(os.path.dirname(golden) or ".", exist_ok=True)
        full_env = dict(os.environ)
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", target,
                               "--loops", loops, script, *map(str, args)],
                              env=full_env, capture_output=True, text=True,
                              cwd=os.path.dirname(script))
        if proc.returncode != 0:
            pytest.fail(f"tracediff: {os.path.basename(script)} exited with status "
                        f"{proc.returncode} while being recorded:\n{proc.stderr[-4000:]}",
                        pytrace=False)
        if g.update:
            return None
        return g.compare(golden, target, rtol, atol)

    return check


@pytest.fixture
def tracediff_golden(request, tmp_path):
    """`with tracediff_golden(golden, rtol=None, atol=None): ...`: record the block in this
    process and compare with GOLDEN when it ends (see the module docstring)."""
    g = _Golden(request, tmp_path)

    @contextlib.contextmanager
    def golden_block(golden, rtol=None, atol=None, loops="opaque"):
        from .api import record

        golden = g.path(golden)
        if not g.update:
            g.usable(golden, "records the with-block into it")
        target = golden if g.update else g.new_trace()
        if g.update:
            os.makedirs(os.path.dirname(golden) or ".", exist_ok=True)
        box = {}
        with record(target, loops=loops):
            yield box
        if not g.update:
            box["result"] = g.compare(golden, target, rtol, atol)

    return golden_block
