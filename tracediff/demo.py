"""`tracediff demo`: the whole job on a bundled example, on one machine.

Records the bundled Flax GRU + expm + optax Adam example twice, concurrently: once
plainly, once with XLA's CPU code generation limited to SSE4.2
(`XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`), which changes results the way a different CPU
does. Then locates the first operation where the two runs disagree.
"""

import os
import subprocess
import sys
import time

from rich.console import Console
from rich.markup import escape

from .errors import TraceError
from .shell import command

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples", "jax_gru_expm_adam.py")
ISA_FLAGS = "--xla_cpu_max_isa=SSE4_2"


def _record(script, out, steps, xla_flags):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    cmd = [sys.executable, "-m", "tracediff", "record", "-o", out, script, "--steps", str(steps)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_demo(folder, steps=3, console=None):
    """Record both runs into `folder`, print the locate report; returns locate's result."""
    try:
        import jax  # noqa: F401
        import flax  # noqa: F401
        import optax  # noqa: F401
    except ImportError as exc:
        raise TraceError(f"the demo needs JAX, Flax and optax ({exc.name} is missing): "
                         "pip install 'tracediff-ml[jax]'") from None
    console = console or Console()
    os.makedirs(folder, exist_ok=True)
    a, b = os.path.join(folder, "a.h5"), os.path.join(folder, "b.h5")
    console.print(f"[bold]tracediff demo[/]: a Flax GRU + expm + optax Adam script ({steps} steps), "
                  f"recorded twice on this machine:")
    console.print(f"  a.h5: plain                 python {os.path.basename(EXAMPLE)}")
    console.print(f"  b.h5: XLA_FLAGS={ISA_FLAGS}  (XLA's CPU code generation limited to "
                  "SSE4.2, as on an older CPU)")
    start = time.perf_counter()
    with console.status("recording both runs (compiling every primitive takes a few seconds)..."):
        procs = {path: _record(EXAMPLE, path, steps, flags) for path, flags in ((a, None), (b, ISA_FLAGS))}
        outputs = {path: p.communicate() for path, p in procs.items()}
    for path, p in procs.items():
        if p.returncode != 0:
            raise TraceError(f"recording {path} failed: {outputs[path][1].strip().splitlines()[-1:]}")
    console.print(f"recorded in {time.perf_counter() - start:.1f} s. The script printed:")
    for label, path in (("a", a), ("b", b)):
        line = [ln for ln in outputs[path][0].splitlines() if ln.startswith("final loss")]
        console.print(f"  {label}: {line[0] if line else '(nothing)'}")
    cmd = command("tracediff", "locate", os.path.relpath(a), os.path.relpath(b))
    console.print(f"\n[bold]$ {escape(cmd)}[/]\n")
    from .diff.locate import locate
    from .report.terminal import print_locate

    result = locate(a, b)
    print_locate(result, console=console)
    return result
