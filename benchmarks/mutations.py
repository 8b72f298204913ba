"""A re-runnable mutation audit: each mutation below applied alone to this tree, the tests
that own the code run against it, and whether they catch it (fail).

Why: a mutation that no owning test catches is behaviour that no test pins down: the code
can break there and CI stays green (issue 66's audit found four such mutations). This
script lets anyone run those mutations again after changing the code or its tests, and
check that each one is still caught.

    python benchmarks/mutations.py                    # every mutation in MUTATIONS
    python benchmarks/mutations.py --only coverage-run-start,stops-farthest-table
    python benchmarks/mutations.py --round 2          # one audit round's mutations
    python benchmarks/mutations.py --list             # ids, files, tests; runs nothing
    python benchmarks/mutations.py --whole            # the owning files whole (no -k)

To add a mutation, append a `Mutation` to MUTATIONS: an id, the file, the function it sits
in, the exact original text (it must occur once in the file), the mutated text, the test
files that own the code, and pytest arguments (`-m deep` for the deep stage's tests, `-k`
to pick the tests that pin the behaviour down: a module's recordings are what its tests
cost), and the audit round that chose it (`round=`). A mutation that cannot change any
outcome (it only changes the cost) takes `equivalent="why"`: it is listed but not run or
counted.

The script refuses to start where git reports changes to a file it mutates, checks first
that the owning tests pass without any mutation (the baseline), restores each file to
its exact bytes after its run (on Ctrl-C and SIGTERM too, and drops that file's bytecode so
that no stale .pyc is used), and prints a Markdown table. If it is killed with SIGKILL,
`git checkout -- FILE` restores the file.
"""

import argparse
import dataclasses
import glob
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
    id: str
    file: str            # relative to the repository root
    function: str        # where the mutation is, for the table
    original: str        # exact text, once in the file
    mutated: str
    tests: tuple         # the owning test files
    args: tuple = ()     # pytest arguments: ("-m", "deep"), ("-k", "expr")
    equivalent: str = ""  # why no test can catch it (not run, not counted)
    round: int = 1        # the audit round that chose it (`--round`)


DEEP = ("-m", "deep")
ANY = ("-m", "not field")     # both the README suite and the deep stage

MUTATIONS = [
    Mutation("stops-farthest-table", "tracediff/diff/pairing/stops.py", "_differing_table",
             "(ka in best and best[ka][2] <= d)", "(ka in best and best[ka][2] >= d)",
             ("tests/test_port_breaks.py",), DEEP + ("-k", "table")),
    Mutation("stops-first-table", "tracediff/diff/pairing/stops.py", "_differing_table",
             "(ka in best and best[ka][2] <= d)", "(ka in best)",
             ("tests/test_port_breaks.py",), DEEP + ("-k", "table")),
    Mutation("coverage-run-start", "tracediff/diff/coverage.py", "_runs",
             "start = e if start is None else start", "start = e",
             ("tests/test_coverage.py",)),
    Mutation("wait-never-settles", "tracediff/capture/jax/digest_groups.py", "DigestGroups._wait",
             "if self._waiting_bytes + need > WAIT_BYTES:", "if False:",
             ("tests/test_jax_digest.py",), DEEP + ("-k", "wait")),
    Mutation("wait-bound-inverted", "tracediff/capture/jax/digest_groups.py",
             "DigestGroups._wait",
             "if self._waiting_bytes + need > WAIT_BYTES:",
             "if self._waiting_bytes + need < WAIT_BYTES:",
             ("tests/test_jax_digest.py",), DEEP + ("-k", "wait")),
    Mutation("wait-bound-inclusive", "tracediff/capture/jax/digest_groups.py",
             "DigestGroups._wait",
             "if self._waiting_bytes + need > WAIT_BYTES:",
             "if self._waiting_bytes + need >= WAIT_BYTES:",
             ("tests/test_jax_digest.py",), DEEP + ("-k", "wait")),
    Mutation("replay-hashes-inverted", "tracediff/capture/jax/replay.py", "_Replay._measure_replay",
             "same = hr == hc if", "same = hr != hc if",
             ("tests/test_jax_capture.py",), ANY + ("-k", "replay or rounds or hashed")),
    Mutation("replay-unhashed-same", "tracediff/capture/jax/replay.py", "_Replay._measure_replay",
             "else values.same_bytes(r, c)", "else True",
             ("tests/test_jax_capture.py",), ANY + ("-k", "replay or rounds or hashed")),
    Mutation("replay-always-bytes", "tracediff/capture/jax/replay.py", "_Replay._measure_replay",
             "same = hr == hc if hr is not None and hc is not None else values.same_bytes(r, c)",
             "same = values.same_bytes(r, c)",
             ("tests/test_jax_capture.py",), ANY + ("-k", "replay or rounds or hashed"),
             equivalent="equal words64 hashes are equal bytes: the same counts, only a second "
                        "pass over a train step's state (its cost)"),
]


# Round 2 (issue 66, "Tests that catch bugs in the code they own"): 25 mutations of the code
# changed since 247fcf8, a few in each module, each a plausible slip (`--round 2`).
NONFINITE = ("tests/test_nonfinite.py",)
CACHE = ("tests/test_program_cache.py",)
SOURCES = ("tests/test_sources.py",)
SIGNALS = ("tests/test_attacks_signals.py",)
SETTINGS = ("tests/test_optimizer_settings.py", "tests/test_torch_capture.py")
UNFORMATTABLE = ANY + ("-k", "cannot_be_formatted or cannot_name")
STATS = ("tests/test_fast_capture.py",)
DIGEST = ("tests/test_jax_digest.py", "tests/test_fast_capture.py")
DIGEST_K = ANY + ("-k", "device_statistics or in_program_stats")
ROUND2 = [
    # -- diff/nonfinite/
    Mutation("nf-counts-stop-past-value", "tracediff/diff/nonfinite/counts.py", "Counts._masked",
             "stop = start + nbytes[sel] // size", "stop = start + nbytes[sel] // size + 1",
             NONFINITE),
    Mutation("nf-call-is-a-root", "tracediff/diff/nonfinite/graph.py", "NonFiniteGraph.__init__",
             "self.roots = np.flatnonzero(self.bad & ~self.holder & ~self.fed_bad)",
             "self.roots = np.flatnonzero(self.bad & ~self.fed_bad)", NONFINITE),
    Mutation("nf-want-nan-inverted", "tracediff/diff/nonfinite/graph.py", "NonFiniteGraph.reach",
             "want_nan = self.nan_ev[root] == 0", "want_nan = self.nan_ev[root] > 0",
             NONFINITE),
    Mutation("nf-zeros-plural", "tracediff/diff/nonfinite/mechanism.py", "_zero_words",
             "zero{'s' if v.zeros > 1 else ''}", "zero{'s' if v.zeros >= 1 else ''}",
             NONFINITE),
    Mutation("nf-absorbed-counts-itself", "tracediff/diff/nonfinite/origin.py", "find_nonfinite",
             "        absorbed = absorbed[1:]\n", "", NONFINITE),
    # -- capture/jax/cache_entries.py, program_cache.py
    Mutation("cache-sticky-folder-itself", "tracediff/capture/jax/cache_entries.py",
             "unsafe_folder",
             "if writable and (first or not st.st_mode & stat.S_ISVTX):",
             "if writable and not st.st_mode & stat.S_ISVTX:", CACHE, DEEP + ("-k", "folder")),
    Mutation("cache-bound-inclusive", "tracediff/capture/jax/cache_entries.py", "read_bounded",
             "if st.st_size > limit:", "if st.st_size >= limit:", CACHE,
             DEEP + ("-k", "second_recording")),
    Mutation("cache-seal-without-name", "tracediff/capture/jax/cache_entries.py", "_mac",
             'name.encode() + b"\\0" + payload', "payload", CACHE,
             DEEP + ("-k", "another_name")),
    Mutation("cache-trim-one-too-many", "tracediff/capture/jax/cache_entries.py", "trim",
             "if total <= max_bytes:", "if total < max_bytes:", CACHE, DEEP + ("-k", "trim")),
    # -- diff/explain/sources.py, source_kinds.py, source_fixes.py
    Mutation("src-nonfinite-side-swapped", "tracediff/diff/explain/source_kinds.py",
             "value_words", 'side = "b" if (fa & ~fb).any() else "a"',
             'side = "a" if (fa & ~fb).any() else "b"', SOURCES, ("-k", "arguments or shares")),
    Mutation("src-arguments-one-group", "tracediff/diff/explain/sources.py", "_group",
             "             cl.arguments)   # each set", '             "")   # each set', SOURCES,
             ("-k", "arguments or shares")),
    Mutation("src-unshared-not-by-first-event", "tracediff/diff/explain/sources.py", "_group",
             "out.sort(key=lambda s: (s.share is None, -(s.share or 0.0), s.first_event))",
             "out.sort(key=lambda s: (s.share is None, -(s.share or 0.0)))", SOURCES,
             ("-k", "arguments or shares")),
    Mutation("src-argv-key-misnamed", "tracediff/diff/explain/source_fixes.py", "fix",
             'if e["key"] == "script.argv"]', 'if e["key"] == "script.args"]', SOURCES,
             ("-k", "arguments or shares")),
    # -- diff/engine/search.py (probe equations)
    Mutation("search-probe-eqn-skipped", "tracediff/diff/engine/search.py",
             "DivergenceSearch.search",
             "if state.probe[ea] and self.sa.kind[ea] != schema.KIND_EQN:",
             "if state.probe[ea]:", ("tests/test_locate.py",), ("-k", "never_skipped")),
    Mutation("search-probe-judged-by-its-own-call", "tracediff/diff/engine/search.py",
             "DivergenceSearch._search_eqn", "if probed:   # a probe's",
             "if False:   # a probe's", ("tests/test_locate.py",), ("-k", "never_skipped")),
    # -- trace/norms.py, trace/values.py, capture/jax/digest_stats.py
    Mutation("stats-large-value-always-plain", "tracediff/trace/values.py", "_one_float_stats",
             "if norms.plain_one(x.dtype, x.size, amax):", "if True:", STATS,
             ("-k", "tiny or huge")),
    Mutation("norms-mean-over-every-number", "tracediff/trace/norms.py", "mean_l2",
             "n = x.size if count is None else count", "n = x.size", STATS,
             ("-k", "tiny or huge or nan")),
    Mutation("digest-big-squares-scaled-once", "tracediff/capture/jax/digest_stats.py", "finish",
             "np.ldexp(f[:, 4], 2 * UP)", "np.ldexp(f[:, 4], UP)", DIGEST, DIGEST_K),
    Mutation("digest-inf-counted-as-big", "tracediff/capture/jax/digest_stats.py", "terms",
             "big = fin & (mag >= np.uint32(_BIG))", "big = mag >= np.uint32(_BIG)", DIGEST,
             DIGEST_K),
    # -- runner/signals.py (Termination), trace/writer/signals.py
    # the flush back outside the SIGINT branch, as it was before `Termination`
    Mutation("sig-sigterm-flushes-output", "tracediff/runner/signals.py", "exit_by_signal",
             "        atexit._run_exitfuncs()\n"
             "        for stream in (sys.stdout, sys.stderr):   "
             "# Python's finalization flushes them\n"
             "            try:\n                stream.flush()\n            except Exception:\n"
             "                pass\n",
             "        atexit._run_exitfuncs()\n"
             "    for stream in (sys.stdout, sys.stderr):\n"
             "        try:\n            stream.flush()\n        except Exception:\n"
             "            pass\n",
             SIGNALS, DEEP + ("-k", "sigterm_ends_the_recorded_run")),
    Mutation("sig-ends-below-innermost-own-frame", "tracediff/runner/signals.py",
             "Termination.take", "                own = f\n", "                own = own or f\n",
             ("tests/test_reliability.py",) + SIGNALS,
             ANY + ("-k", "sigterm_taken_inside or sigterm_ends_the_recorded_run")),
    Mutation("sig-child-signals-stay-blocked", "tracediff/trace/writer/signals.py",
             "settle_in_child", "    finally:\n        _unmask(mask)\n",
             "    finally:\n        pass\n", SIGNALS, DEEP + ("-k", "forked_child")),
    # -- capture/skipped.py, capture/optim_settings.py
    Mutation("skipped-repeats-named", "tracediff/capture/skipped.py", "Skipped.add",
             "if where in self.seen or len(self.seen) >= MAX_SEEN:",
             "if len(self.seen) >= MAX_SEEN:", SETTINGS, UNFORMATTABLE),
    Mutation("settings-float-override-called", "tracediff/capture/optim_settings.py", "scalar",
             "(float.__float__(v) if isinstance(v, float) else int.__float__(v))", "float(v)",
             SETTINGS, UNFORMATTABLE),
    Mutation("settings-wrapper-named", "tracediff/capture/optim_settings.py", "_walk",
             "if factory and factory not in _WRAPPERS:", "if factory:", SETTINGS,
             UNFORMATTABLE),
]
ROUND2 = [dataclasses.replace(m, round=2) for m in ROUND2]
MUTATIONS = MUTATIONS + ROUND2

class Stop(Exception):
    """SIGTERM: end like Ctrl-C, through every `finally` (the file restored)."""


def _on_term(signum, frame):
    raise Stop()


def _git_dirty(files):
    out = subprocess.run(["git", "status", "--porcelain", "--", *sorted(set(files))], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return out.strip()


def _drop_bytecode(path):
    """A rewritten file of the same size in the same second would pass a stale .pyc's check
    (mtime in seconds and size): remove the file's bytecode so that it is compiled again."""
    stem = os.path.splitext(os.path.basename(path))[0]
    for pyc in glob.glob(os.path.join(os.path.dirname(path), "__pycache__", f"{stem}.*.pyc")):
        try:
            os.unlink(pyc)
        except FileNotFoundError:
            pass


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    _drop_bytecode(path)


def _pytest_args(m, whole):
    args = list(m.args)
    if whole:   # drop -k EXPR: every test of the owning files runs
        args = [a for i, a in enumerate(args) if a != "-k" and (i == 0 or args[i - 1] != "-k")]
    return args


def _run_tests(python, tests, args, timeout):
    """(outcome, failed test ids, seconds): outcome "passed", "failed", "skipped" (all of
    them: a premise this machine lacks), "timeout" or "error: ..."."""
    cmd = [python, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "-rfEs",
           *args, *tests]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the pytest we started, and its children
        proc.communicate()
        return "timeout", [], time.monotonic() - start
    finally:
        if proc.poll() is None:   # Ctrl-C or SIGTERM while it ran
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - start
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    if proc.returncode == 1:
        return "failed", failed, took
    if proc.returncode == 0:
        ran = re.search(r"(\d+) passed", summary)
        return ("passed" if ran else "skipped: " + summary), [], took
    return f"error: pytest exit {proc.returncode}: {summary[-200:]}", failed, took


def _check(mutations):
    problems = []
    for m in mutations:
        with open(os.path.join(ROOT, m.file), encoding="utf-8") as f:
            n = f.read().count(m.original)
        if n != 1:
            problems.append(f"{m.id}: the original text occurs {n} times in {m.file}")
        for t in m.tests:
            if not os.path.exists(os.path.join(ROOT, t)):
                problems.append(f"{m.id}: no test file {t}")
    return problems


def _caught_by(failed):
    return ", ".join(f.split("::", 1)[-1] for f in failed[:2]) or "?"


def run(mutations, python, timeout, whole, baseline=True):
    rows, caught, counted = [], 0, 0
    if baseline:
        for tests, args in dict.fromkeys((m.tests, tuple(_pytest_args(m, whole)))
                                         for m in mutations if not m.equivalent):
            outcome, failed, took = _run_tests(python, tests, args, timeout)
            print(f"baseline {' '.join(tests)} {' '.join(args)}: {outcome} ({took:.0f} s)",
                  file=sys.stderr)
            if outcome != "passed":
                sys.exit(f"the owning tests do not pass without a mutation ({outcome}: "
                         f"{', '.join(failed)}): fix them before the audit")
    for m in mutations:
        where = f"`{m.file}`:`{m.function}`"
        if m.equivalent:
            rows.append((m.id, where, f"equivalent: {m.equivalent}", "-"))
            continue
        path = os.path.join(ROOT, m.file)
        with open(path, "rb") as f:
            before = f.read()
        text = before.decode("utf-8")
        try:
            _write(path, text.replace(m.original, m.mutated, 1).encode("utf-8"))
            outcome, failed, took = _run_tests(python, m.tests, _pytest_args(m, whole), timeout)
        finally:
            _write(path, before)
            with open(path, "rb") as f:
                assert f.read() == before, f"{m.file} was not restored: git checkout -- {m.file}"
        counted += 1
        if outcome in ("failed", "timeout"):
            caught += 1
            by = _caught_by(failed) if outcome == "failed" else "timeout"
        else:
            by = f"**not caught** ({outcome})"
        rows.append((m.id, where, by, f"{took:.0f} s"))
        print(f"{m.id}: {by} ({took:.0f} s)", file=sys.stderr)
    return rows, caught, counted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated mutation ids")
    ap.add_argument("--round", type=int, help="only the mutations of this audit round (1, 2)")
    ap.add_argument("--list", action="store_true", help="list the mutations; run nothing")
    ap.add_argument("--whole", action="store_true",
                    help="run the owning test files whole (drop the -k selections)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per test run")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run of the owning tests")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to run pytest")
    a = ap.parse_args()
    chosen = MUTATIONS
    if a.only:
        ids = a.only.split(",")
        unknown = set(ids) - {m.id for m in MUTATIONS}
        if unknown:
            sys.exit(f"unknown mutation ids: {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTATIONS if m.id in ids]
    if a.round is not None:
        chosen = [m for m in chosen if m.round == a.round]
    if a.list:
        for m in chosen:
            print(f"{m.id}\t{m.file}:{m.function}\t{' '.join(m.tests)} {' '.join(m.args)}"
                  + (f"\t(equivalent: {m.equivalent})" if m.equivalent else ""))
        return 0
    problems = _check(chosen)
    if problems:
        sys.exit("\n".join(problems))
    dirty = _git_dirty(m.file for m in chosen)
    if dirty:
        sys.exit(f"refusing to mutate files with changes of their own (commit or stash them):\n"
                 f"{dirty}")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # a background run too
    try:
        rows, caught, counted = run(chosen, a.python, a.timeout, a.whole, not a.no_baseline)
    except (KeyboardInterrupt, Stop):
        dirty = _git_dirty(m.file for m in chosen)
        sys.exit("interrupted: " + (f"these files still differ from git:\n{dirty}" if dirty
                                    else "every mutated file restored"))
    print("| mutation | file:function | caught by | time |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{caught} of {counted} mutations caught"
          + (f" ({len(rows) - counted} equivalent, not run)" if len(rows) > counted else ""))
    dirty = _git_dirty(m.file for m in chosen)
    if dirty:
        sys.exit(f"a mutated file differs from git after the audit:\n{dirty}")
    return 0 if caught == counted else 1


if __name__ == "__main__":
    sys.exit(main())
