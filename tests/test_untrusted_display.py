"""Trace strings reach the user's terminal and Markdown as text, never as commands.

A real torch_dot recording and a diverging one (the broken dot kernel) are copied and edited
with h5py: the dot event's op, name stack, source, autograd node, params and output name, and
the manifest's hostname, script, argv, environment, package versions, CPU, OS, end status and
recording notes get terminal escapes (clear screen, OSC 0 window title, an OSC 8 hidden
hyperlink, BEL, an 8-bit CSI, a bidi override), rich markup (`[/]`, `[link=...]`,
`[bold red]`) and Markdown/HTML payloads. info, show, locate and explain (on a pipe and with
rich forced to a terminal) and the Markdown and HTML reports must show them as text.
"""

import html
import html.parser
import json
import re
import shutil

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from tracediff.cli import main as cli_main

from .conftest import BROKEN_DOT

# invisible format characters (Unicode category Cf) that hide or reorder text: Arabic
# letter mark, word joiner, invisible plus, a TAG letter, interlinear annotation anchor,
# soft hyphen, a bidi isolate and its pop
INVISIBLE = "\u061c\u2060\u2064\U000e0041\ufff9\u00ad\u2066\u2069"
TERM = ("\x1b[2J\x1b]0;pwned\x07\x1b]8;;https://evil.example/\x1b\\osc8-click\x1b]8;;\x1b\\"
        "\x9b31m\u202eRTL" + INVISIBLE)
RICH = "[/][link=https://evil.example/]rich-link[/link][bold red]red"
MD = ("`x```<script>alert(1)</script><img src=x onerror=alert(1)><svg onload=alert(2)>"
      "|cell|[x](javascript:alert(3))")
PAYLOAD = TERM + RICH + MD
OP = "aten::dot" + PAYLOAD

# what a user must see instead: every control character as text, the markup as typed
SHOWN = [r"\x1b[2J", r"\x1b]0;pwned\x07", r"\x1b]8;;https://evil.example/", r"\x9b31m",
         r"\u202eRTL\u061c\u2060\u2064\U000e0041\ufff9\xad\u2066\u2069", RICH,
         "<script>alert(1)</script>"]
SGR = re.compile(r"\x1b\[[0-9;]*m")   # rich's own colours when it writes to a terminal
BAD_BYTES = ("\x1b", "\x07", "\x9b", "\u202e", *INVISIBLE)


@pytest.fixture(scope="module")
def hostile(recorded, tmp_path_factory):
    """(a, b): the diverging dot pair with the payload in every displayed string."""
    d = tmp_path_factory.mktemp("untrusted_display")
    a, b = recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)
    out = []
    for side, src in (("a", a), ("b", b)):
        dst = d / f"hostile_{side}.h5"
        shutil.copyfile(src, dst)
        _poison(dst, side)
        out.append(str(dst))
    return tuple(out)


def _poison(path, side):
    with h5py.File(path, "r+") as f:
        n = int(f.attrs["committed_strings"])
        strings = [s.decode() if isinstance(s, bytes) else s for s in f["strings"][:n]]
        dot = strings.index("aten::dot")
        f["strings"][dot] = OP
        extra = ["mod" + PAYLOAD, "torch_dot.py" + PAYLOAD + ":6", "Node" + PAYLOAD,
                 "k=" + PAYLOAD, "out" + PAYLOAD]
        f["strings"].resize((n + len(extra),))
        f["strings"][n:] = extra
        f.attrs["committed_strings"] = n + len(extra)
        ev = f["events"][()]
        (eid,) = np.flatnonzero(ev["op"] == dot)
        for col, k in (("name_stack", 0), ("source", 1), ("node", 2), ("params", 3)):
            ev[col][eid] = n + k
        f["events"][...] = ev
        vals = f["values"][()]
        vals["name"][(vals["event"] == eid) & (vals["role"] == 0)] = n + 4
        f["values"][...] = vals
        m = json.loads(f["manifest"][()])
        m["hostname"] = f"{side}-host{PAYLOAD}"
        m["created"] = PAYLOAD
        m["script"].update(name=f"torch_dot{PAYLOAD}.py", path=f"/x/{PAYLOAD}/torch_dot.py",
                           argv=["torch_dot.py", PAYLOAD], sha256=side * 64)
        m["env"] = {"XLA_FLAGS": PAYLOAD + side, f"K{PAYLOAD}": side}
        m["packages"]["torch"] += PAYLOAD + side
        m["cpu"]["model"] = PAYLOAD
        m["os"]["platform"] = PAYLOAD
        m["end"] = {"status": PAYLOAD, "exit_code": 3}
        m["recording"]["note"] = PAYLOAD
        del f["manifest"]
        f.create_dataset("manifest", data=json.dumps(m), dtype=h5py.string_dtype())
    return path


def _run(args, tty):
    """The CLI in-process, stdout not a terminal, or rich forced to one (FORCE_COLOR, TERM);
    wide enough that rich does not wrap the lines we look for."""
    env = {"COLUMNS": "4000", "TRACEDIFF_NO_PROGRESS": "1", "NO_COLOR": None,
           "FORCE_COLOR": "1" if tty else None, "TERM": "xterm-256color" if tty else "dumb"}
    return CliRunner(env=env).invoke(cli_main, [str(x) for x in args], catch_exceptions=False)


def _clean(text, tty):
    """`text` holds no terminal control: not a byte of ESC, BEL, C1 CSI or bidi override
    (on a terminal, only rich's own colour codes)."""
    rest = SGR.sub("", text) if tty else text
    bad = [repr(c) for c in BAD_BYTES if c in rest]
    assert not bad, (bad, text[:3000])
    assert "\x1b]8;" not in text          # no hyperlink of any kind


def _shown(text, *extra):
    for s in (*SHOWN, *extra):
        assert s in text, (s, text[:5000])


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_info_shows_hostile_manifest_and_ops_as_text(hostile, tty):
    res = _run(["info", hostile[0]], tty)
    assert res.exit_code == 0, res.output        # `[/]` used to crash it (MarkupError)
    _clean(res.output, tty)
    out = SGR.sub("", res.output)
    _shown(out, r"a-host\x1b[2J", r"torch_dot\x1b[2J", "aten::dot" + r"\x1b[2J")
    assert r"\x1b[2J\x1b]0;pwned\x07" in out.split("packages:")[1].split("\n")[0]


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_show_prints_event_strings_as_text(hostile, tty):
    res = _run(["show", hostile[0], "1"], tty)
    assert res.exit_code == 0, res.output
    _clean(res.output, tty)
    out = SGR.sub("", res.output)
    _shown(out, "name_stack: mod" + r"\x1b[2J", "source: torch_dot.py" + r"\x1b[2J",
           "node: Node" + r"\x1b[2J", "params: k=" + r"\x1b[2J", "out" + r"\x1b[2J")
    # the op line: the whole name on one line, markup shown as typed
    line = next(ln for ln in out.splitlines() if ln.startswith("event 1"))
    assert "aten::dot" + r"\x1b[2J" in line and RICH in line


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
@pytest.mark.parametrize("verbose", [False, True], ids=["short", "verbose"])
def test_locate_prints_hostile_strings_as_text(hostile, tty, verbose):
    res = _run(["locate", *(["-v"] if verbose else []), *hostile], tty)
    assert res.exit_code == 1, res.output
    _clean(res.stdout, tty)
    _clean(res.stderr, tty)
    out = SGR.sub("", res.stdout)
    _shown(out, "name stack: mod" + r"\x1b[2J", "source: torch_dot.py" + r"\x1b[2J",
           "aten::dot" + r"\x1b[2J", r"K\x1b[2J")
    # warnings quote the script name and end status from the manifests
    assert "tracediff: warning: the traces come from different scripts (torch_dot" + \
        r"\x1b[2J" in res.stderr
    assert r"ended with \x1b[2J" in res.stderr


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_explain_prints_hostile_strings_as_text(hostile, tty):
    res = _run(["explain", *hostile], tty)
    assert res.exit_code == 1, res.output
    _clean(res.stdout, tty)
    _clean(res.stderr, tty)
    out = SGR.sub("", res.stdout)
    origin = next(ln for ln in out.splitlines() if ln.startswith("origin:"))
    _shown(origin, "aten::dot" + r"\x1b[2J", "mod" + r"\x1b[2J", "torch_dot.py" + r"\x1b[2J")
    assert r"\x1b[2J" in out.split("replay verdict:")[1]


def test_error_messages_quoting_a_hostile_name_are_printable(hostile, tmp_path):
    """A trace saved under an attacker-chosen name: the one-line error shows it escaped."""
    bad = tmp_path / "t\x1b[2J\x1b]0;pwned\x07.h5"
    bad.write_bytes(b"not an HDF5 file at all")
    res = _run(["info", bad], False)
    assert res.exit_code == 2
    _clean(res.stderr, False)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracediff: error: ")
    assert r"t\x1b[2J\x1b]0;pwned\x07.h5: not an HDF5 file" in lines[0]


class _Tags(html.parser.HTMLParser):
    """Tags, attributes, visible text and the cells of each table row of an HTML text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text, self.rows = [], [], [], []
        self.code, self._code = [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th") and self.rows:
            self.rows[-1] += 1
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        if tag == "code" and self._code is not None:
            self.code.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        self.text.append(data)
        if self._code is not None:
            self._code.append(data)


def _no_active_content(p, own_scripts=0, own_svgs=0):
    assert p.tags.count("script") == own_scripts and "img" not in p.tags
    assert p.tags.count("svg") == own_svgs
    handlers = [(t, k) for t, k, _ in p.attrs if k.startswith("on")]
    assert not handlers
    assert not [v for _, k, v in p.attrs if k in ("href", "src") and "javascript" in v.lower()]


def test_markdown_report_renders_trace_strings_as_text(hostile, tmp_path):
    from markdown_it import MarkdownIt

    out = tmp_path / "report.md"
    res = _run(["report", *hostile, "-o", out], False)
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    _clean(text, False)
    for s in (r"\x1b[2J", r"\u202eRTL", r"a-host\x1b[2J"):
        assert s in text
    # rendered as GitHub would (CommonMark with raw HTML allowed, plus tables)
    page = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    p = _Tags()
    p.feed(page)
    p.close()
    _no_active_content(p)
    shown = "".join(p.text)
    assert "<script>alert(1)</script><img src=x onerror=alert(1)>" in shown
    assert RICH in shown
    # every table row has as many cells as its header: a `|` in a value stays in its cell
    assert p.rows and len(set(p.rows)) <= 2, p.rows     # the finding table and 4-column env
    env_rows = [n for n in p.rows if n != 2]
    assert env_rows and set(env_rows) == {4}
    # the op name is one code span, whole: its backticks do not end it
    assert any(c.startswith("aten::dot") and c.endswith("(3))") for c in p.code), p.code
    # the reproduction commands (argv holds ``` and HTML) stay one code block
    assert any("tracediff record -o" in c and "<script>" in c and "tracediff locate" in c
               for c in p.code), p.code


def test_html_report_escapes_trace_strings(hostile, tmp_path):
    out = tmp_path / "report.html"
    res = _run(["report", *hostile, "-o", out], False)
    assert res.exit_code == 0, res.output
    page = out.read_text(encoding="utf-8")
    _clean(page, False)
    p = _Tags()
    p.feed(page)
    p.close()
    _no_active_content(p, own_scripts=1, own_svgs=1)
    shown = "".join(p.text)
    assert "<script>alert(1)</script><img src=x onerror=alert(1)>" in shown
    assert r"\x1b[2J\x1b]0;pwned\x07" in shown
    # the op, backticks and all, is one <code> element in the summary and the culprit title
    whole = [c for c in p.code if c.startswith("aten::dot") and c.endswith("(3))")]
    assert len(whole) >= 2, p.code


def test_every_invisible_or_control_character_is_escaped():
    """By Unicode category, not a list: every control (Cc), format (Cf: bidi isolates
    U+2066-2069, U+061C, U+2060-2064, the TAG block, U+FFF9-FFFB, the soft hyphen, ...),
    line/paragraph separator and lone surrogate becomes visible text; letters, symbols
    and spaces of any script stay as written."""
    import sys
    import unicodedata

    from tracediff.untrusted import markup, md_code, printable

    bad = [chr(c) for c in range(sys.maxunicode + 1)
           if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Cs")]
    assert {"\u2066", "\u2069", "\u061c", "\u2060", "\u2064", "\U000e0001", "\U000e007f",
            "\ufff9", "\ufffb", "\u00ad"} <= set(bad)
    text = "".join(bad)
    for out in (printable(text), markup(text), md_code(text, cell=True)):
        assert not [c for c in out if c in set(bad)], out[:200]
    assert printable("\u2066x\u2069") == r"\u2066x\u2069"
    assert printable("\U000e0041\u00ad") == r"\U000e0041\xad"
    kept = "é中← ñ😀\u00a0x"
    assert printable(kept) == kept


def test_html_report_escapes_quotes_in_trace_strings(hostile, tmp_path):
    """Quotes from a trace are escaped too (`&quot;`, `&#x27;`): the report's escaping is
    safe in an attribute value as well as in text, wherever a renderer puts a string."""
    quoted = OP + "\" onmouseover=\"alert(4)\" x='y' onfocus='alert(5)"
    copies = []
    for side, src in zip("ab", hostile):
        dst = tmp_path / f"quoted_{side}.h5"
        shutil.copyfile(src, dst)
        with h5py.File(dst, "r+") as f:
            n = int(f.attrs["committed_strings"])
            strings = [s.decode() if isinstance(s, bytes) else s for s in f["strings"][:n]]
            f["strings"][strings.index(OP)] = quoted
        copies.append(dst)
    out = tmp_path / "report.html"
    res = _run(["report", *copies, "-o", out], False)
    assert res.exit_code == 0, res.output
    page = out.read_text(encoding="utf-8")
    assert "onmouseover=" in page                 # the op is in the report ...
    assert '" onmouseover="' not in page and "x='y'" not in page   # ... its quotes escaped
    assert "&quot; onmouseover=&quot;alert(4)&quot; x=&#x27;y&#x27;" in page
    p = _Tags()
    p.feed(page)
    p.close()
    _no_active_content(p, own_scripts=1, own_svgs=1)
    assert "onmouseover=\"alert(4)\" x='y'" in "".join(p.text)   # shown as typed
