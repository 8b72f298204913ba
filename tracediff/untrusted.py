"""Strings from a trace are untrusted: how to show them, quote them and paste them safely.

A trace arrives attached to a bug report, so every string in it (op names, sources, name
stacks, hostnames, environment keys and values, file names) may have been written to
attack whoever opens it. Everything that leaves tracediff — terminal text, rich markup,
Markdown, generated Python, printed shell commands — goes through one of these functions:

- `printable(s)`: control characters (C0, DEL, C1), every format character (Unicode
  category Cf: bidi embeddings, overrides and isolates, zero-width characters, the soft
  hyphen, invisible operators, TAG characters), line and paragraph separators and lone
  surrogates escaped as `\\xNN` / `\\uNNNN` / `\\UNNNNNNNN`, so no escape sequence reaches a
  terminal, no string spans lines and no invisible character hides or reorders text.
- `markup(s)`: `printable` plus rich markup escaped (`[link=…]` is shown, not followed).
- `md_code(s)` / `md_text(s)`: a Markdown code span that the string cannot end, and text
  with Markdown and HTML syntax escaped (`md_code(s, cell=True)` inside a table cell).
- `shell_word(s)`, `env_assignment(k, v)`: one shell word (`shlex.quote` of the printable
  form); `KEY=value` only for keys that are shell identifiers, otherwise None.
- `py_str(s)`: a Python string literal (`repr` of the printable form) for generated code.
"""

import re
import shlex
import unicodedata

# Every character outside printable ASCII is a candidate; `_escape_char` escapes those of
# the categories below, by Unicode's own classification rather than a list (a list misses
# U+061C, U+2060-2064, the TAG block, ...): Cc controls (C0, DEL, C1), Cf format
# characters (bidi embeddings/overrides/isolates and marks, zero-width characters, BOM,
# soft hyphen, invisible operators, interlinear annotation, TAG characters), Zl/Zp line
# and paragraph separators, Cs lone surrogates (from JSON "\\ud800" escapes: no UTF-8
# file or terminal can take them).
_CANDIDATE = re.compile("[^\x20-\x7e]")
UNSAFE_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Inline Markdown syntax: emphasis, code, links/images (their `[`), tables, strikethrough,
# headings. `(` only matters after `]` (escaped) and `-`, `+`, `.`, `)`, `=` only where the
# text starts (_MD_LEADING), so elsewhere they stay as written and the raw file readable.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")
_MD_LEADING = re.compile(r"^(\s*\d*)([-+=.)])")


def _escape_char(m):
    c = m.group(0)
    if unicodedata.category(c) not in UNSAFE_CATEGORIES:
        return c
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def printable(s, limit=None):
    """`s` as one line of plain text with every control character escaped; cut to
    `limit` characters (with an ellipsis) when given."""
    s = _CANDIDATE.sub(_escape_char, str(s))
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 1)] + "…"
    return s


def markup(s, limit=None):
    """`s` for a rich console or rich Text-from-markup: printable, markup escaped."""
    from rich.markup import escape

    return escape(printable(s, limit))


def md_code(s, limit=None, cell=False):
    """A Markdown inline code span holding `s` literally (printable): the fence is longer
    than any run of backticks in `s`; with `cell`, `|` is escaped so a table cell stays
    one cell (GitHub unescapes it inside the span)."""
    s = printable(s, limit)
    if cell:
        s = s.replace("|", "\\|")
    longest = max((len(r) for r in re.findall("`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_text(s, limit=None):
    """`s` as Markdown text that renders as itself: HTML and Markdown syntax escaped."""
    s = printable(s, limit)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    # a list marker or setext underline where the text starts (`- x`, `1. x`, `===`)
    return _MD_LEADING.sub(r"\1\\\2", s, count=1)


def shell_word(s):
    """One shell word for `s` (its printable form): safe to paste into a shell."""
    return shlex.quote(printable(s))


def is_env_name(key):
    """True when `key` can be set as `KEY=value` in a POSIX shell."""
    return isinstance(key, str) and bool(_SHELL_NAME.match(key))


def env_assignment(key, value):
    """`KEY='value'` for a shell command line, or None when `key` is not a shell name
    (such a key is shown to the user, never emitted as part of a command)."""
    if not is_env_name(key):
        return None
    return f"{key}={shell_word(value)}"


def py_str(s):
    """A Python string literal for `s` (printable form) in generated source code."""
    return repr(printable(s))


__all__ = ["printable", "markup", "md_code", "md_text", "shell_word", "is_env_name",
           "env_assignment", "py_str"]
