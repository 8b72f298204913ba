"""Strings from a trace never reach generated code or printed commands unescaped, and
tracediff's outputs are written safely.

Two real recordings of fixtures/torch_dot.py (a at level full, b at level stats with the
broken dot build, so locate prints the zoom-in commands), copied and edited with h5py:
hostile sources, name stacks, params, hostnames, environment keys and values, argv and
file names. The reproducer must compile, run, and run nothing else; every printed
command must parse (shlex) to exactly the expected words.
"""

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import tracediff
from tracediff.cli import main
from tracediff.diff.compare import levels
from tracediff.diff.explain.replay.calls import build_call
from tracediff.diff.explain.replay.params import CannotReplay, _py
from tracediff.report.context import report_context
from tracediff.report.json_report import next_steps

from .conftest import BROKEN_DOT
from .helpers import run_cli, run_plain, script_env

DOT = 1            # event 1 of torch_dot.py is aten::dot
MUL = 2            # event 2 is aten::mul.Tensor (other=2)
PAYLOAD = 'open("pwned_{}", "w")'   # a marker file in the cwd: no "/" needed in a file name


def _markers(folder):
    return sorted(p for p in os.listdir(folder) if p.startswith("pwned"))


@pytest.fixture(scope="module")
def traces(recorded):
    return recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT,
                                              options=["--level", "stats"])


def _add_string(f, s):
    """Append `s` to the strings table (committed) and return its index."""
    ds = f["strings"]
    n = int(f.attrs["committed_strings"])
    ds.resize((n + 1,))
    ds[n] = s
    f.attrs["committed_strings"] = n + 1
    return n


def _edit(src, dst, event=None, manifest=None, **strings):
    """Copy trace `src` to `dst`; give `event` the strings (source=..., name_stack=...,
    params=...) and update the manifest with `manifest` (a function of the dict)."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        if strings:
            ev = f["events"][()]
            for col, s in strings.items():
                ev[col][event] = _add_string(f, s)
            f["events"][...] = ev
        if manifest is not None:
            m = json.loads(f["manifest"][()])
            manifest(m)
            del f["manifest"]
            f.create_dataset("manifest", data=json.dumps(m), dtype=h5py.string_dtype())
    return dst


def _cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def _run_repro(folder):
    """`python repro.py` in FOLDER (a warm interpreter where the tests have one)."""
    return run_plain(os.path.join(folder, "repro.py"), cwd=folder, check=False)


# -- 1. the generated reproducer ------------------------------------------------------------

def test_repro_header_strings_cannot_break_out_of_the_docstring(traces, tmp_path):
    full, _ = traces
    evil = tmp_path / ('x\n"""\n' + PAYLOAD.format("file") + '\n""".h5')
    src = 'torch_dot.py:6\n"""\n' + PAYLOAD.format("source") + '\n"""'
    ns = "net\n'''\"\"\"\n" + PAYLOAD.format("ns")
    host = 'vm\ud800\n"""\n' + PAYLOAD.format("host") + "\n#"   # JSON can hold a lone surrogate

    def hostile(m):
        m["hostname"] = host
        m["frameworks"]["torch"]["version"] = '2"""\n' + PAYLOAD.format("version")

    _edit(full, evil, DOT, hostile, source=src, name_stack=ns)
    out = tmp_path / "r"
    code, _, err = _cli("repro", evil, DOT, "-o", out)
    assert code == 0, err
    text = (out / "repro.py").read_text()
    compile(text, "repro.py", "exec")
    run = _run_repro(out)
    assert run.returncode == 0 and "identical" in run.stdout, run.stdout + run.stderr
    assert _markers(out) == []
    # the recorded strings are shown, escaped, on comment lines of their own
    assert '# recorded at: torch_dot.py:6\\x0a"""\\x0aopen("pwned_source", "w")\\x0a""", ' \
           'step 0, name stack net\\x0a\'\'\'"""\\x0aopen("pwned_ns", "w")' in text.splitlines()
    assert f"# op: aten::dot (torch), event {DOT} of x\\x0a\"\"\"\\x0a" \
           'open("pwned_file", "w")\\x0a""".h5' in text.splitlines()
    assert '# recorded on: vm\\ud800\\x0a"""\\x0aopen("pwned_host", "w")\\x0a#, torch 2"""\\x0a' \
           'open("pwned_version", "w")' in text.splitlines()
    # nothing but the fixed docstring, comments and tracediff's own code
    tree = ast.parse(text)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "open" not in calls


def test_repro_windows_source_path(traces, tmp_path):
    full, _ = traces
    t = _edit(full, tmp_path / "win.h5", DOT, source="C:\\Users\\x\\torch_dot.py:6")
    code, _, err = _cli("repro", t, DOT, "-o", tmp_path / "r")
    assert code == 0, err
    text = (tmp_path / "r" / "repro.py").read_text()
    compile(text, "repro.py", "exec")
    assert "# recorded at: C:\\Users\\x\\torch_dot.py:6, step 0" in text.splitlines()


def test_repro_params_cannot_name_code(traces, tmp_path):
    """A literal tuple that looks like one of replay's named constants stays a literal."""
    full, _ = traces
    for i, params in enumerate((
            "other=('torch_dtype', 'float32 if " + PAYLOAD.format("dtype") + " else 0')",
            "other=('torch_memfmt', 'x, **{" + PAYLOAD.format("memfmt") + ": 1}')",
            "other=[('np_dtype', 'float32) + " + PAYLOAD.format("np") + "')]")):
        # the generated call holds the tuple as a literal: it cannot run anything
        code = build_call("torch", "aten::mul.Tensor", params, 1).code()
        assert code == f"torch.ops.aten.mul.Tensor(self=inputs[0], other={params[6:]})"
        ast.literal_eval(params[6:])
        # and `repro` refuses the op: its output size cannot be computed from a tuple
        t = _edit(full, tmp_path / f"p{i}.h5", MUL, params=params)
        out = tmp_path / f"r{i}"
        code, _, err = _cli("repro", t, MUL, "-o", out)
        assert code == 2 and "replay refused" in err and len(err.strip().splitlines()) == 1, err
        assert not (out / "repro.py").exists()
    # the real named constants still work
    call = build_call("torch", "aten::_to_copy", "dtype=torch.float64, "
                      "memory_format=torch.preserve_format", 1)
    assert call.code() == ("torch.ops.aten._to_copy.default(self=inputs[0], dtype=torch.float64, "
                           "memory_format=torch.preserve_format)")


def test_params_keys_and_values_are_checked():
    for bad in ("f=1, **inf", "_posx=1"):
        with pytest.raises(CannotReplay):
            build_call("torch", "aten::mul.Tensor", bad, 2)
    with pytest.raises(CannotReplay):
        build_call("jax", "tanh", "accuracy=None, **nan", 1)
    assert _py(complex(float("nan"), 1.0), "jax") == "complex(float('nan'), 1.0)"


# -- 2. printed shell commands ------------------------------------------------------------

ENV_A = {"OMP_NUM_THREADS": "4"}
ENV_B = {"OMP_NUM_THREADS": "1'; touch pwned_v; '",
         "XLA_FLAGS=x; touch pwned_k; X": "v",
         "MKL_CBWR": ["not", "a", "string"]}
ARGV_B = ["train.py", "--x", "a\nb; touch pwned_a"]
HOST_B = "evil\ntouch pwned_h #"
KEY_NOTE = "# not emitted: env key 'XLA_FLAGS=x; touch pwned_k; X' is not a shell name"


@pytest.fixture(scope="module")
def hostile_pair(traces, tmp_path_factory):
    full, stats = traces
    d = tmp_path_factory.mktemp("hostile_pair")

    def side_a(m):
        m["env"] = dict(ENV_A)
        m["script"]["argv"] = ["train.py"]
        m["hostname"] = "vm"   # the recording machine's own name otherwise (runsc on gVisor)

    def side_b(m):
        m["env"] = dict(ENV_B)
        m["script"]["argv"] = list(ARGV_B)
        m["hostname"] = HOST_B

    a = _edit(full, d / "a.h5", manifest=side_a)
    b = _edit(stats, d / "b '$(touch pwned_f)'.h5", manifest=side_b)
    return str(a), str(b), tracediff.locate(str(a), str(b), explain=False)


def _check_lines(lines):
    """Every line is a comment or one command whose first word is `tracediff` or an
    environment assignment; no hostile text ever runs."""
    for line in lines:
        assert "\n" not in line and "\r" not in line
        if line.startswith("#"):
            continue
        words = shlex.split(line)
        first = next(w for w in words if "=" not in w or not w.split("=")[0].isidentifier())
        assert first == "tracediff", line
        # one simple command: no unquoted ; & | ( ) < > (a quoted one is part of a word)
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        assert not [t for t in lex if t and set(t) <= set(";&|()<>")], line


def test_zoom_commands_quote_every_word(hostile_pair):
    a, b, result = hostile_pair
    root_a, root_b = a[:-3], b[:-3]
    zoom = result.levels["zoom"][0]
    assert shlex.split(zoom["a"]["command"]) == [
        "OMP_NUM_THREADS=4", "tracediff", "record", "--level", "full", "--steps", "0:1",
        "-o", f"{root_a}.step0.h5", "train.py"]
    assert shlex.split(zoom["b"]["command"]) == [
        "OMP_NUM_THREADS=1'; touch pwned_v; '", "tracediff", "record", "--level", "full",
        "--steps", "0:1", "-o", f"{root_b}.step0.h5", "train.py", "--x",
        "a\\x0ab; touch pwned_a"]
    assert zoom["b"]["notes"] == [
        "# not emitted: env MKL_CBWR has a value that is not a string", KEY_NOTE]
    assert shlex.split(zoom["then"]) == ["tracediff", "locate", f"{root_a}.step0.h5",
                                         f"{root_b}.step0.h5"]
    lines = levels.zoom_lines(result)
    assert lines[0] == ("# zoom in on step 0 at full level: on machine a (vm), then on "
                        "machine b (evil\\x0atouch pwned_h #):")
    assert KEY_NOTE in lines
    _check_lines(lines)
    steps = next_steps(result)
    _check_lines(steps)
    assert shlex.split(steps[1]) == ["tracediff", "show", b, str(DOT)]


def test_report_reproduce_block(hostile_pair):
    a, b, result = hostile_pair
    cmds = report_context(result).commands
    name_b = os.path.basename(b)
    assert [shlex.split(c) for c in cmds if not c.startswith("#")] == [
        ["OMP_NUM_THREADS=4", "tracediff", "record", "-o", "a.h5", "train.py"],
        ["OMP_NUM_THREADS=1'; touch pwned_v; '", "tracediff", "record", "-o", name_b,
         "train.py", "--x", "a\\x0ab; touch pwned_a"],
        ["tracediff", "locate", "a.h5", name_b],
        ["tracediff", "show", "a.h5", str(DOT)]]
    assert KEY_NOTE in cmds
    _check_lines(cmds)


def test_report_reproduce_block_damaged_manifest(traces, tmp_path):
    """argv of the wrong type and a hostile tool name: still one safe line each."""
    full, stats = traces

    def damaged(m):
        m["script"]["argv"] = {"0": "train.py"}
        m["recording"]["tool"] = "x\ntouch pwned_t"
        m["env"] = {"A": 1.5}

    a = _edit(full, tmp_path / "a.h5", manifest=damaged)
    b = _edit(stats, tmp_path / "b.h5", manifest=lambda m: m["script"].update(argv=[3, None]))
    cmds = report_context(tracediff.locate(str(a), str(b), explain=False)).commands
    assert cmds[:2] == ["# a: recorded with x\\x0atouch pwned_t (no script command line)",
                        "# b: recorded with tracediff record (no script command line)"]
    _check_lines(cmds)


def test_probe_pattern_of_a_hostile_jit_name():
    op = "jit:f'$(touch pwned)\n"
    pat = levels.probe_pattern(op)
    assert pat == "^f'\\$\\(touch\\ pwned\\)\\x0a$" and "\n" not in pat
    import re

    assert re.search(pat, op[4:])
    assert shlex.split(shlex.quote(pat)) == [pat]


# -- 3. outputs ---------------------------------------------------------------------------

def test_repro_refuses_to_overwrite_or_follow_links(traces, tmp_path):
    full, _ = traces
    out = tmp_path / "r"
    assert _cli("repro", full, DOT, "-o", out)[0] == 0
    before = (out / "repro.py").read_bytes()
    (out / "repro.py").write_text("# mine\n")
    code, _, err = _cli("repro", full, DOT, "-o", out)
    assert code == 2 and err.count("\n") == 1
    assert "already exists" in err and "--force" in err
    assert (out / "repro.py").read_text() == "# mine\n"
    # links are refused and, with --force, replaced, never followed
    target = tmp_path / "target.txt"
    target.write_text("precious\n")
    for name in ("repro.py", "inputs.npz"):
        os.unlink(out / name)
        os.symlink(target, out / name)
        code, _, err = _cli("repro", full, DOT, "-o", out)
        assert code == 2 and "already exists" in err
        assert target.read_text() == "precious\n"
    os.symlink(tmp_path / "nowhere", out / "dangling")
    os.unlink(out / "repro.py")
    os.rename(out / "dangling", out / "repro.py")
    assert _cli("repro", full, DOT, "-o", out)[0] == 2
    assert not os.path.exists(tmp_path / "nowhere")
    code, _, err = _cli("repro", full, DOT, "-o", out, "--force")
    assert code == 0, err
    assert target.read_text() == "precious\n" and not os.path.exists(tmp_path / "nowhere")
    assert not os.path.islink(out / "repro.py") and not os.path.islink(out / "inputs.npz")
    assert (out / "repro.py").read_bytes() == before
    assert np.load(out / "inputs.npz")["in0"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("command", ["show", "report", "check", "slice"])
def test_no_output_is_written_through_or_over_a_link_without_force(traces, tmp_path, command):
    """Before: `show --npy LINK` and `report -o LINK` replaced the file the link points to.
    A link (a dangling one too) is refused in one line, exit 2; --force replaces the link
    itself, never what it points to."""
    full, broken = traces
    target, nowhere = tmp_path / "target.txt", tmp_path / "nowhere"
    target.write_text("precious\n")
    (tmp_path / "train.py").write_text("")
    link = tmp_path / ("out.md" if command in ("report", "check") else
                       "out.npy" if command == "show" else "out.h5")
    argv = {"show": ("show", full, DOT, "--npy", link),
            "report": ("report", full, broken, "-o", link),
            # refused before the script (an empty file here) runs
            "check": ("check", "--report", link, full, tmp_path / "train.py"),
            "slice": ("slice", full, "--around", DOT, "-o", link)}[command]
    run = (lambda *a: (lambda p: (p.returncode, p.stdout, p.stderr))(run_cli(*a))) \
        if command == "check" else _cli
    for dest in (target, nowhere):
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(dest, link)
        code, _, err = run(*argv)
        assert code == 2 and err.count("\n") == 1 and "--force" in err, err
        assert target.read_text() == "precious\n" and not os.path.exists(nowhere)
    if command == "check":
        return
    code, _, err = run(*argv, "--force")
    assert code == 0, err
    assert not os.path.islink(link) and target.read_text() == "precious\n"
    assert not os.path.exists(nowhere)
    if command == "show":
        assert np.load(link).tolist() == 14.0   # dot([0, 1, 2, 3], itself)


def test_write_errors_exit_2(traces, tmp_path):
    full, _ = traces
    code, _, err = _cli("show", full, DOT, "--npy", "/dev/full")
    assert code == 2
    assert err == "tracediff: error: cannot write /dev/full: No space left on device\n"
    env = script_env()
    with open("/dev/full", "w") as sink:
        proc = subprocess.run([sys.executable, "-m", "tracediff", "show", str(full), str(DOT)],
                              stdout=sink, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == ("tracediff: error: cannot write to standard output: No space left "
                           "on device\n")


def test_error_lines_quote_trace_strings_printably(traces, tmp_path):
    full, _ = traces
    t = _edit(full, tmp_path / "esc.h5", DOT, op="aten::dot\x1b]0;pwned\x07\nx")
    code, _, err = _cli("repro", t, DOT, "-o", tmp_path / "r")
    assert code == 2 and "\x1b" not in err and err.count("\n") == 1
    assert err == ("tracediff: error: cannot write a reproducer for aten::dot\\x1b]0;pwned\\x07"
                   "\\x0ax (event 1): aten::dot\\x1b]0;pwned\\x07\\x0ax is not on the list of "
                   "ops tracediff replays\n")
    assert not os.path.exists(tmp_path / "r")
    (tmp_path / "file").write_text("")
    code, _, err = _cli("repro", full, DOT, "-o", tmp_path / "file")
    assert (code, err) == (2, f"tracediff: error: {tmp_path / 'file'} exists and is not a "
                              f"folder (give -o a folder)\n")
