"""What every command shares: the guard that turns any failure into one line on stderr
and exit code 2 (never a traceback), output to stdout that must reach it, the click
context settings, the checks of trace and --map arguments made before any work, the
options several commands take (--rtol/--atol, --source-dir) and the printing of a
locate result (locate, check).
"""

import contextlib
import functools
import json
import os
import sys

import click

from ..errors import TraceError, one_line
from ..report.json_report import build as build_json
from ..shell import command
from ..untrusted import printable


def guard(fn):
    """Turn TraceError (and unreadable input) into one clear line and exit code 2.

    Any other exception escaping a command is also one line and exit code 2 (a trace
    from a stranger must never produce a traceback); TRACEDIFF_DEBUG=1 shows it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TraceError as exc:
            click.echo(f"tracediff: error: {one_line(exc)}", err=True)
            sys.exit(2)
        except BrokenPipeError:
            sys.exit(0)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except MemoryError:
            click.echo("tracediff: error: out of memory (is the trace damaged or hostile?)",
                       err=True)
            sys.exit(2)
        except Exception as exc:
            if os.environ.get("TRACEDIFF_DEBUG"):
                raise
            click.echo(f"tracediff: error: unexpected {type(exc).__name__}: {one_line(exc)} "
                       f"(a damaged input? TRACEDIFF_DEBUG=1 shows the traceback)", err=True)
            sys.exit(2)

    return wrapper


@contextlib.contextmanager
def to_stdout():
    """Output to stdout that must reach it: a write or flush error (a full disk, EIO) is
    one TraceError line, not an "unexpected" one, and not a second error at exit."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        try:   # what is still buffered goes nowhere at exit, instead of failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        raise TraceError(f"cannot write to standard output: {exc.strerror or exc}") from None


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def need_trace(path, what="trace"):
    """A clear error, with the fix, for a trace argument that is not there."""
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such {what} file (record one with: "
                         f"{command('tracediff', 'record', '-o', path)} SCRIPT.py [ARGS...])")


def user_map(spec):
    """--map, inline JSON or a JSON file, read and checked before any trace is opened
    (bounded; a FIFO or device refused at once): the dict, or None."""
    if spec is None:
        return None
    from ..diff.pairing.mapfile import load_map

    return load_map(spec)


def tolerance_options(fn):
    fn = click.option("--atol", type=click.FloatRange(min=0), default=None, metavar="X",
                      help="Absolute tolerance for every floating dtype (default: per dtype, "
                           "e.g. 1e-6 for float32).")(fn)
    fn = click.option("--rtol", type=click.FloatRange(min=0), default=None, metavar="X",
                      help="Relative tolerance for every floating dtype (default: per dtype, "
                           "e.g. 1e-5 for float32).")(fn)
    return fn




def source_dir_option(fn):
    """--source-dir: the only way a local source file is read (the trace's recorded lines
    are shown otherwise); see report/source_context.py."""
    return click.option(
        "--source-dir", type=click.Path(exists=True, file_okay=False), default=None,
        metavar="DIR",
        help="Show the culprit's code from this folder (your checkout of the script's "
             "folder) instead of the lines the trace recorded, when the file there is the "
             "recorded one (same sha256). Only regular files inside DIR are read.")(fn)


def print_result(result, as_json=False, verbose=False, quiet=False, source_dir=None):
    if quiet:
        return
    for w in result.warnings:
        click.echo(f"tracediff: warning: {printable(w)}", err=True)
    if as_json:
        click.echo(json.dumps(build_json(result), indent=2))
    else:
        from ..report.terminal import print_locate

        print_locate(result, verbose=verbose, source_dir=source_dir)
