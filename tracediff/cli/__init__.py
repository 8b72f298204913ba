"""Command line: record, info, show, locate, replicas, explain, confirm, repro, slice,
report, check, demo.

Bad input: one line on stderr that says how to fix it, exit code 2. The commands live by
family (recording.py: record, check; locating.py: locate, replicas, explain; confirming.py:
confirm; reports.py:
info, show, repro, slice, report); this module makes the `tracediff` group of them, in
workflow order, and holds `demo`.
"""

import click

from .._version import __version__
from .confirming import confirm
from .locating import explain, locate, replicas
from .recording import check, record
from .reports import info, repro, report, show, slice_command
from .shared import CONTEXT, guard


class _Ordered(click.Group):
    """List commands in workflow order (record, inspect, compare, report), not A-Z."""

    def list_commands(self, ctx):
        return list(self.commands)


@click.group(cls=_Ordered, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tracediff")
def main():
    """Find the first operation where two runs of a numerical ML program disagree.

    Record the same script twice (two machines, two library versions, two flags),
    then compare the traces:

    \b
      tracediff record -o a.h5 train.py --steps 3     # run a
      tracediff record -o b.h5 train.py --steps 3     # run b, elsewhere
      tracediff locate a.h5 b.h5                      # the first op that differs
      tracediff report a.h5 b.h5 -o report.md         # Markdown for a bug report
      tracediff check golden.h5 train.py --steps 3    # CI: compare with a golden

    \b
    Exit codes: 0 match, 1 diverged, 2 error (the message says how to fix it), 3
    inconclusive (nothing differs in what was compared, but too little was compared).
    `tracediff demo` runs the whole workflow on a bundled example.
    `tracediff COMMAND -h` explains each command.
    """


@click.command(context_settings=CONTEXT)
@click.option("--dir", "folder", default="tracediff-demo", show_default=True, metavar="DIR",
              help="Folder for the two traces.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="Training steps of the example.")
@guard
def demo(folder, steps):
    """See tracediff work: record a bundled JAX example twice and locate the divergence.

    The two runs are on this machine: one plain, one with XLA's CPU code generation
    limited to SSE4.2 (as on an older CPU). Needs JAX, Flax and optax; about a minute.

    \b
    Example:
      tracediff demo --dir /tmp/demo && tracediff report /tmp/demo/a.h5 /tmp/demo/b.h5 -o r.html
    """
    from ..demo import run_demo

    run_demo(folder, steps)


# In workflow order: `tracediff --help` lists them so (`_Ordered`).
for _cmd in (record, info, show, locate, replicas, explain, confirm, repro, slice_command, report,
             check, demo):
    main.add_command(_cmd)

# One line each in `tracediff --help`.
for _cmd, _text in ((record, "Run a script unmodified and record every operation into a trace."),
                    (info, "Summarise a trace, and name the op its first NaN came from."),
                    (show, "Show one event of a trace: op, source, inputs, values."),
                    (locate, "Name the first operation where two traces disagree."),
                    (confirm, "Check each source of a difference by re-running with the "
                              "other side's settings."),
                    (explain, "Explain a divergence: origin, chain, replay verdict, causes."),
                    (repro, "Write a standalone script reproducing one recorded op."),
                    (slice_command, "Cut a trace down to one event and its neighbours (to attach)."),
                    (report, "Write a Markdown or HTML bug report comparing two traces."),
                    (check, "Record a script and compare it with a golden trace (CI)."),
                    (demo, "Record a bundled example twice and locate the divergence.")):
    _cmd.short_help = _text
