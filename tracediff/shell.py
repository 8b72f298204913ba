"""Shell command lines that tracediff prints for the user to copy: next steps, the zoom-in
recipes of the two-level search, a report's "Reproduce" block, hints in error messages.

Their words come from traces (argv, environment, op names) and from file names, so every
such line is built here and nowhere else:

- each word is one `shell_word` (quoted, control characters escaped: a word never spans
  lines, never ends the command, never expands);
- environment variables are `env_assignment`s; a key that is not a shell name, or a value
  that is not a string, is never part of a command: a `# not emitted: ...` note line says so;
- comments are `printable`: a hostname with a newline cannot start a new command.

`record_command` is the one builder of `tracediff record` lines (levels.py's zoom-in
recipes and the report's Reproduce block use it).
"""

from .untrusted import env_assignment, is_env_name, printable, shell_word

NOTE_LIMIT = 200   # characters of a trace string quoted in a note


def command(*words):
    """One command line of exactly these words."""
    return " ".join(shell_word(str(w)) for w in words)


def comment(text):
    """A `# ...` line (or trailing comment): one line whatever `text` holds."""
    return "# " + printable(text)


def with_comment(line, text):
    """`line` followed by a trailing `# text`."""
    return f"{line}   {comment(text)}"


def script_argv(manifest):
    """The script's recorded command line (a list of strings), or None when the manifest
    has none or it is not a list of strings."""
    script = manifest.get("script") if isinstance(manifest, dict) else None
    argv = script.get("argv") if isinstance(script, dict) else None
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        return list(argv)
    return None


def env_differences(mine, other):
    """The variables of environment `mine` that `other` does not set to the same value."""
    mine = mine if isinstance(mine, dict) else {}
    other = other if isinstance(other, dict) else {}
    return {k: v for k, v in mine.items() if other.get(k) != v}


def env_words(env):
    """(assignments, notes): a `KEY='value'` word for each variable of `env` that a shell
    can set (sorted), a note line for each that it cannot."""
    words, notes = [], []
    for key in sorted(env, key=str):
        value = env[key]
        if not is_env_name(key):
            notes.append(comment(f"not emitted: env key {printable(repr(key), NOTE_LIMIT)} "
                                 f"is not a shell name"))
        elif not isinstance(value, str):
            notes.append(comment(f"not emitted: env {key} has a value that is not a string"))
        else:
            words.append(env_assignment(key, value))
    return words, notes


def record_command(argv, out, env=None, options=(), nproc=None):
    """The lines that record `argv` into trace `out`: note lines for the variables of `env`
    that cannot be set, then `KEY='value' ... tracediff record OPTIONS -o OUT ARGV...`;
    with `nproc` (an int), under `python -m torch.distributed.run --nproc-per-node N`."""
    words, notes = env_words(env or {})
    if isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 1:
        line = command("python", "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                       "-m", "tracediff", "record", *options, "-o", out, *argv)
    else:
        line = command("tracediff", "record", *options, "-o", out, *argv)
    return notes + [" ".join([*words, line])]


__all__ = ["command", "comment", "with_comment", "script_argv", "env_differences", "env_words",
           "record_command"]
