"""What the Markdown and HTML reports share: the locate JSON plus a little context.

`report_data(result)` is `json_report.build(result)` (the same data as `tracediff locate --json`)
with one extra key, "report", holding what only the trace files and this machine know:
file sizes, each run's command line and numeric environment variables, and the user's
source lines around the culprit as the trace recorded them (a local file only with
`--source-dir`, see `source_context`).
Renderers take that dict; sections for fields a future `locate` adds ("explain": the
replay verdict, "chain": origin to outputs) appear when the fields are present.
"""

import math
import os
import re

from ..trace import sources
from ..trace.sources import parse_source
from ..untrusted import md_code, md_text
from .json_report import build

GITHUB_ATTACH_LIMIT = 25 << 20


def fmt(x, digits=3):
    """A number as a short human string ('-' for None)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1e15:
            return fmt(int(x))
        return f"{x:.{digits}g}"
    return str(x)


def fmt_pct(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "-"
    return f"{100 * x:.3g}%"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"


def culprit(data):
    """(finding dict, title) of what the report is about, or (None, None)."""
    if data.get("first_beyond_tolerance"):
        return data["first_beyond_tolerance"], "First divergence beyond tolerance"
    if data.get("first_difference"):
        return data["first_difference"], "First bitwise difference (within tolerance)"
    return None, None


def event_label(e, code=md_code, text=md_text):
    """'jax eqn `tanh`' style label of an event dict; `code` and `text` render trace
    strings for the output format (Markdown by default)."""
    origin = f" ({text(e['origin'])})" if e.get("origin") and e.get("origin") != e.get("kind") else ""
    return (f"{text(e.get('framework', ''))} {text(e.get('kind', ''))}{origin} "
            f"{code(e.get('op', '?'))}").strip()


def where(e, code=md_code):
    """'step 0, event #375, `Controller/GRUCell_0`, `jax_gru.py:25`'."""
    parts = [f"step {e.get('step')}", f"event #{e.get('index')}"]
    if e.get("name_stack"):
        parts.append(code(e["name_stack"]))
    if e.get("source"):
        parts.append(code(e["source"]))
    return ", ".join(parts)


def finding_rows(f, code, text, strong):
    """The (label, cell) rows describing a finding, rendered with the caller's markup:
    `code` and `text` turn trace strings into safe cells of the output format, `strong`
    emphasises text that is already rendered."""
    a, b = f["a"], f["b"]
    rows = []
    if (f.get("layer") or {}).get("text"):   # two frameworks: the layer on both sides
        rows.append(("layer", code(f["layer"]["text"])))
    if a.get("name_stack") or b.get("name_stack"):
        ns = code(a.get("name_stack") or "-")
        if b.get("name_stack") and b["name_stack"] != a.get("name_stack"):
            ns += f" (b: {code(b['name_stack'])})"
        rows.append(("name stack", ns))
    if a.get("source"):
        src = code(a["source"])
        if b.get("source") and b["source"] != a["source"]:
            src += f" (b: {code(b['source'])})"
        rows.append(("source", src))
    if b.get("op") != a.get("op") or b.get("framework") != a.get("framework"):
        rows.append(("paired with", f"{event_label(b, code, text)} in b "
                                    f"(by {text(f.get('paired_by'))})"))
    shapes = ", ".join(f"{d}{list(s)}" for d, s in zip(a.get("dtypes") or [], a.get("shapes") or []))
    rows.append(("outputs", code(shapes or "-")))
    word = {True: strong("introduced here"), False: "inherited", None: "unknown"}[f.get("inputs_match")]
    rows.append(("inputs", f"{word}: {text(f.get('inputs_reason') or '')}"))
    if f.get("call"):
        c = f["call"]
        rows.append(("inside compiled call", f"{code(c['op'])} (a #{text(c['a'])}, b #{text(c['b'])})"))
    if f.get("note"):
        rows.append(("note", text(f["note"])))
    return rows


def summary(data, code=md_code, text=md_text):
    """One paragraph; trace strings rendered by `code` and `text` (Markdown inline
    syntax by default)."""
    a, b = data["traces"]["a"], data["traces"]["b"]
    script = code(a.get("script")) if a.get("script") else "the script"
    script_b = b.get("script")
    one = a.get("framework") and b.get("framework") and a.get("path") == b.get("path")
    runs = (f"The {text(a['framework'])} and {text(b['framework'])} sides of {script}" if one else
            f"Two runs of {script}" if not script_b or script_b == a.get("script") else
            f"A run of {script} and a run of {code(script_b)}")
    hosts = ""
    if a.get("hostname") and b.get("hostname") and a["hostname"] != b["hostname"]:
        hosts = f" (on {code(a['hostname'])} and {code(b['hostname'])})"
    f, _ = culprit(data)
    tol = data.get("tolerance") or {}
    tol_txt = ("the per-dtype default tolerances" if tol.get("rtol") is None and tol.get("atol") is None
               else f"rtol {fmt(tol.get('rtol'))}, atol {fmt(tol.get('atol'))}")
    out = []
    if data["verdict"] == "diverged":
        e, m = f["a"], f.get("metrics") or {}
        out.append(f"{runs}{hosts} diverge beyond {tol_txt}. The first operation whose outputs "
                   f"differ beyond tolerance is the {event_label(e, code, text)} at "
                   f"{where(e, code)}: max relative "
                   f"difference {fmt(m.get('max_rel'))}, max ULP {fmt(m.get('max_ulp'))}, "
                   f"{fmt_pct(m.get('beyond_tolerance_fraction'))} of its elements beyond tolerance.")
        if f.get("inputs_match") is True:
            out.append("Its inputs match, so the difference is introduced by this operation.")
        elif f.get("inputs_match") is False:
            out.append("Its inputs already differ, so the difference is inherited from an "
                       "earlier operation.")
        fd = data.get("first_difference")
        if fd and fd["a"].get("index") != e.get("index"):
            out.append(f"The first bitwise difference comes earlier, at the "
                       f"{event_label(fd['a'], code, text)} ({where(fd['a'], code)}), within "
                       f"tolerance.")
    elif data.get("first_difference"):
        fd = data["first_difference"]
        m = fd.get("metrics") or {}
        out.append(f"{runs}{hosts} agree within {tol_txt}, but not bitwise: the first bitwise "
                   f"difference is at the {event_label(fd['a'], code, text)} "
                   f"({where(fd['a'], code)}), max relative "
                   f"difference {fmt(m.get('max_rel'))}, max ULP {fmt(m.get('max_ulp'))}.")
    else:
        out.append(f"{runs}{hosts} are bitwise identical in every compared value.")
    ex = data.get("explain")
    if isinstance(ex, dict) and ex.get("event"):
        verdict = f" ({text(str(ex['verdict']).split(';')[0])})" if ex.get("verdict") else ""
        out.append(f"The replay analysis names {code(ex['event'])} as the origin{verdict}.")
    steps = [s for s in data.get("optimizer_steps") or [] if not s.get("bitwise_equal")]
    if steps:
        last = data["optimizer_steps"][-1]
        out.append(f"The parameters first differ in the optimizer snapshot of step "
                   f"{steps[0]['step']}; at the last compared step ({last['step']}) the max "
                   f"relative difference is {fmt(last.get('max_rel'))}.")
    env = data.get("env_diff") or []
    if env:
        keys = ", ".join(code(d["key"]) for d in env[:4]) + (" ..." if len(env) > 4 else "")
        out.append(f"The environments differ in {len(env)} "
                   f"{'entry' if len(env) == 1 else 'entries'} ({keys}).")
    else:
        out.append("The recorded environments are identical.")
    return " ".join(out)


# What a report says about the code context (report/markdown.py, html.py, terminal.py).
RECORDED = "recorded in the trace"
MATCHES = "local file matches the recorded sha256"
DIFFERS = "local file differs from the recorded one"
NO_LINES = "the trace holds no source lines for it"


def source_context(source, recorded=None, source_dir=None, manifest=None):
    """The user's lines around `source` ("file.py:25"), from the trace: {"file", "line",
    "lines": [(number, text)], "found", "origin", "note"}; None when `source` has no line
    number. Nothing on this machine is read unless `source_dir` is given.

    `recorded` is `Trace.source_lines(source)` (None for an older trace). With
    `source_dir`, the file is read from there only when it is a regular file inside the
    folder whose sha256 is the recorded one (the manifest's script sha256 for the script
    itself in an older trace); `note` says what happened, `origin` is "trace" or "local".
    Texts are the trace's (or the file's): renderers escape them."""

    parsed = parse_source(source)
    if parsed is None:
        return None
    fname, line = parsed
    out = {"file": fname, "line": line, "lines": [], "found": False, "origin": None,
           "note": None}
    if recorded and recorded.get("lines"):
        out.update(lines=list(recorded["lines"]), found=True, origin="trace")
    if source_dir is None:
        return out
    sha = (recorded or {}).get("sha256")
    if not sha:  # an older trace: the script itself has its sha256 in the manifest
        script = (manifest or {}).get("script") or {}
        if script.get("name") == fname and isinstance(script.get("sha256"), str):
            sha = script["sha256"].lower()
    lines, out["note"] = _local_lines(source_dir, fname, line, sha)
    if lines is not None:
        out.update(lines=lines, found=True, origin="local")
    return out


def _local_lines(source_dir, fname, line, sha):
    """([(number, text)] or None, note) for `fname` read from `source_dir` (see
    `source_context`): a relative path that stays inside the folder once symlinks are
    resolved, a regular file, at most MAX_FILE_BYTES, with the expected sha256."""
    import hashlib


    if os.path.isabs(fname) or fname.startswith("~"):
        return None, "not read: an absolute path"
    try:
        root = os.path.realpath(source_dir)
        path = os.path.realpath(os.path.join(root, fname))
    except (ValueError, OSError):  # a NUL byte, a symlink loop
        return None, "not read: not a valid path"
    if os.path.commonpath([root, path]) != root or path == root:
        return None, "not read: outside --source-dir"
    if not sha:
        return None, "not read: the trace records no sha256 for this file"
    try:
        data = sources.read_regular(path, follow=False)
    except sources.NotRegular:
        return None, "not read: not a regular file in --source-dir"
    except OSError:
        return None, "not read: no such file in --source-dir"
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        return None, DIFFERS
    got = sources.window(sources.split_lines(data), line)
    if got is None:
        return None, DIFFERS
    return [(got[0] + k, t) for k, t in enumerate(got[1])], MATCHES


def _trace_context(path, source=None):
    """File size, command line, environment and manifest of one trace, and the lines it
    recorded around `source` ("recorded": `Trace.source_lines`, None if none)."""
    from ..trace.reader import Trace

    info = {"path": path, "size": None, "argv": None, "env": {}, "tool": None, "manifest": {},
            "recorded": None}
    try:
        info["size"] = os.path.getsize(path)
    except OSError:
        pass
    try:
        with Trace(path) as t:
            m = t.manifest
            if source:
                info["recorded"] = t.source_lines(source)
    except Exception:  # a report never fails over context it cannot read
        return info
    info["manifest"] = m
    info["argv"] = (m.get("script") or {}).get("argv")
    info["env"] = m.get("env") or {}
    info["tool"] = (m.get("recording") or {}).get("tool")
    info["end"] = m.get("end")
    return info


def reproduction(data, ctx):
    """Shell commands that reproduce the comparison (record both runs, locate); lines made
    by `tracediff.shell`, so no string from the traces can add a command."""
    from .. import shell

    cmds = []
    names = {}
    env_a, env_b = ctx["traces"]["a"].get("env"), ctx["traces"]["b"].get("env")
    for side, mine, other in (("a", env_a, env_b), ("b", env_b, env_a)):
        c = ctx["traces"][side]
        name = os.path.basename(data["traces"][side]["path"])
        if side == "b" and name == names.get("a"):
            name = "b_" + name
        names[side] = name
        argv = shell.script_argv({"script": {"argv": c.get("argv")}})
        if not argv:
            cmds.append(shell.comment(f"{side}: recorded with {c.get('tool') or 'tracediff'} "
                                      f"(no script command line)"))
            continue
        cmds += shell.record_command([os.path.basename(argv[0]), *argv[1:]], name,
                                     shell.env_differences(mine, other))
    cmds.append(shell.command("tracediff", "locate", names["a"], names["b"]))
    f, _ = culprit(data)
    if f is not None:
        cmds.append(shell.command("tracediff", "show", names["a"], f["a"]["index"]))
    return cmds


def report_data(result, source_dir=None):
    """`build(result)` plus the "report" context (see the module docstring); code
    context from trace a's recorded lines, or from `source_dir` (`--source-dir`)."""
    data = build(result)
    f, _ = culprit(data)
    src = f["a"].get("source") if f is not None else None
    ctx = {"traces": {s: _trace_context(data["traces"][s]["path"], src if s == "a" else None)
                      for s in ("a", "b")}}
    ctx["source"] = None
    if src:
        a = ctx["traces"]["a"]
        ctx["source"] = source_context(src, a["recorded"], source_dir, a["manifest"])
    ctx["commands"] = reproduction(data, ctx)
    sizes = [ctx["traces"][s]["size"] or 0 for s in ("a", "b")]
    ctx["attach_ok"] = all(s <= GITHUB_ATTACH_LIMIT for s in sizes)
    for s in ("a", "b"):
        ctx["traces"][s].pop("manifest", None)
        ctx["traces"][s].pop("recorded", None)
    data["report"] = ctx
    return data


ROLE_WORDS = {"origin": "origin", "first_beyond_tolerance": "first beyond tolerance",
              "last": "last differing event"}


_MORE_HOPS = re.compile(r"\.\.\. \d+ more hops")


def chain_items(chain, code=md_code, text=md_text, strong=lambda s: f"**{s}**"):
    """Lines for the chain from origin to outputs, trace strings rendered by `code` and
    `text` (Markdown inline syntax by default): one per hop (`op` (event #i, step s,
    source) max rel R, x amplification, role), or a placeholder such as "... 12 more hops"."""
    out = []
    for link in chain if isinstance(chain, list) else []:
        if not isinstance(link, dict):
            s = str(link)
            out.append(s if _MORE_HOPS.fullmatch(s) else text(s))
            continue
        e = link.get("a") if isinstance(link.get("a"), dict) else link
        m = link.get("metrics") or {}
        line = (f"{code(e.get('op', '?'))} (event #{text(e.get('index'))}, step "
                f"{text(e.get('step'))}{', ' + code(e['source']) if e.get('source') else ''})")
        if m.get("max_rel") is not None:
            line += f" max rel {fmt(m.get('max_rel'))}"
        amp = link.get("amplification")
        if isinstance(amp, (int, float)) and not isinstance(amp, bool) and math.isfinite(amp):
            line += f", amplified x{fmt(float(amp))}"
        roles = [ROLE_WORDS.get(r, r) for r in str(link.get("role") or "").split(",") if r]
        if roles:
            line += f" — {strong(text(', '.join(roles)))}"
        out.append(line)
    return out


def explain_parts(explain):
    """(headline, summary or None, [(key, value text)]) of the replay verdict, as plain
    strings: they quote trace strings, so the renderer escapes them."""
    if not isinstance(explain, dict):
        return str(explain), None, []
    head = explain.get("verdict") or explain.get("summary") or ""
    summ = explain.get("summary") if explain.get("summary") not in (None, head) else None
    rows = []
    for k, v in explain.items():
        if k in ("verdict", "summary") or v is None:
            continue
        rows.append((k.replace("_", " "), v if isinstance(v, str) else
                     fmt(v) if isinstance(v, (int, float)) else str(v)))
    return str(head), summ, rows
