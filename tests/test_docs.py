"""README and the documentation site (docs/, mkdocs.yml) checked on their text, without
building the site (CI's docs stage runs `mkdocs build --strict`): README stays short and
keeps the two Quick start commands CI runs, every `tracediff COMMAND` it shows exists,
every option of every command is in docs/commands.md, every page is in the site's nav,
and every relative link points at a file (and heading) that exists."""

import glob
import os
import re
import unicodedata

import pytest

from tracediff.cli import main

from .helpers import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
QUICK_START = ("pip install -e '.[jax]' && tracediff demo",
               "pip install -e '.[test]' && python -m pytest -q")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _pages():
    return sorted(glob.glob(os.path.join(DOCS, "*.md")))


def _code(text):
    """The text inside fenced blocks and inline code spans: where commands are shown."""
    blocks = [m.group(0) for m in FENCE.finditer(text)]
    spans = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return "\n".join(blocks + spans)


def _prose(text):
    """The text outside code: where links are."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _slugs(text):
    """The anchors a page's headings get, in both spellings a link may use: the site's
    (Python-Markdown's toc) and GitHub's (README on github.com)."""
    out = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", text), re.M):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        ascii_ = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
        out.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_).strip().lower()))
        out.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return out


def test_readme_is_short():
    n = len(_read(README).splitlines())
    assert n <= 250, f"README.md has {n} lines; the reference belongs in docs/"


def test_quick_start_commands_are_unchanged():
    """CI (.ci/run) installs and tests exactly as README's Quick start says."""
    readme, ci = _read(README), _read(os.path.join(ROOT, ".ci", "run"))
    for line in QUICK_START:
        assert line in readme.splitlines(), line
    assert "-e '.[test]' && python -m pytest -q\n" in ci   # pip's -q aside, the same


def test_every_command_in_readme_exists():
    shown = set(re.findall(r"(?:^|[\s$;|&(])tracediff ([a-z][a-z_-]*)", _code(_read(README)),
                           re.M))
    assert shown, "README shows no tracediff command"
    unknown = shown - set(main.commands)
    assert not unknown, f"README shows commands the CLI does not have: {sorted(unknown)}"


def test_every_option_of_every_command_is_documented():
    text = _read(os.path.join(DOCS, "commands.md"))
    sections = dict(re.findall(r"^## `tracediff (\w+)`\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    missing = []
    for name, cmd in main.commands.items():
        if name not in sections:
            missing.append(name)
            continue
        for param in cmd.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("-") and not re.search(rf"(?<![\w-]){re.escape(opt)}\b",
                                                         sections[name]):
                    missing.append(f"{name} {opt}")
    assert not missing, ("docs/commands.md lacks (paste `tracediff COMMAND --help`): "
                         f"{missing}")


def test_every_page_is_in_the_nav():
    nav = _read(os.path.join(ROOT, "mkdocs.yml"))
    left_out = [os.path.basename(p) for p in _pages()
                if not re.search(rf":\s*{re.escape(os.path.basename(p))}\s*$", nav, re.M)]
    assert not left_out, f"pages missing from mkdocs.yml's nav: {left_out}"


@pytest.mark.parametrize("path", [README, *_pages()], ids=os.path.basename)
def test_relative_links_resolve(path):
    broken = []
    for target in LINK.findall(_prose(_read(path))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            broken.append(f"{target}: no such file")
        elif path != README and not dest.startswith(DOCS + os.sep):
            broken.append(f"{target}: outside docs/ (the site has no such page; "
                          "write the path as code instead)")
        elif anchor and dest.endswith(".md") and anchor not in _slugs(_read(dest)):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{os.path.relpath(path, ROOT)}: {broken}"
