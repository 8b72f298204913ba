"""What removes a source of the difference, and the counterfactual run that checks it.

For each `Source` (`explain/sources.py`): the fix in words, the command lines that re-record
one side with that source removed (an environment variable set as on the other side,
`JAX_DEFAULT_MATMUL_PRECISION=highest` for a bf16 pass; a comment where only a change to
the script can: the other run's initial parameters or random inputs loaded from a file),
the environment keys that explain it, and the one line `locate` prints. Commands are built
by `shell` only: words from a trace are quoted, never executed.
"""

import math

from ... import shell
from ..result import Cause
from .causes import environment
from .mechanisms.precision import fix_for

# random numbers: (the fix, what the counterfactual run loads from the other run)
_RANDOM = {
    "initialiser": ("initialise the parameters once, save them (np.savez, torch.save, a "
                    "checkpoint) and load them in both runs; or initialise on one device and "
                    "copy", "initial parameters"),
    "random_data": ("draw the random inputs once (or with numpy on the host), save them and "
                    "load them in both runs", "random inputs"),
}


def removes(share):
    """The part of the final relative L2 difference a counterfactual run without a source
    removes: a share is of the difference's square (independent sources add so), so the
    run keeps sqrt(1 - share) of it."""
    return 1.0 - math.sqrt(max(0.0, 1.0 - share))


def _should(share):
    """"should remove ~40% of the difference", or what to look at where no share was given."""
    return (f"should remove ~{removes(share):.0%} of the difference" if share is not None
            else "should remove its part of the difference")


def fix(d, result, cl, src):
    """(fix, counterfactual command lines, cause keys) of a source."""
    argv_side = src.side if src.side in ("a", "b") else "b"
    t = d.ta if argv_side == "a" else d.tb
    argv = shell.script_argv(t.manifest) or ["SCRIPT.py"]
    out = f"{argv_side}.counterfactual.h5"
    other = d.tb.path if argv_side == "a" else d.ta.path
    if src.mechanism in _RANDOM:
        fix_text, what = _RANDOM[src.mechanism]
        return (fix_text,
                [shell.comment(f"re-run {argv_side} with the other run's {what} loaded from a "
                               f"file (a change to the script): {_should(src.share)}; what "
                               f"is left is what the other sources make")], [])
    if src.mechanism == "arguments":
        argv_keys = [e["key"] for e in result.env_diff if e["key"] == "script.argv"]
        why = " (the script's own arguments differ too)" if argv_keys else ""
        return (f"the program calls {cl.op} with other arguments on the two sides{why}: pass "
                f"the same ones", [shell.comment(
                    f"re-run {argv_side} with the arguments of the other run (a change to the "
                    f"script or its command line): {_should(src.share)}")], argv_keys)
    if src.mechanism == "dtype":
        keys = [e["key"] for e in result.env_diff if ".autocast." in e["key"]]
        return (f"compute in the same dtype on both sides: autocast off on {argv_side}, or "
                f"on for both (or the program's cast as on the other side)",
                [shell.comment(f"re-run {argv_side} in the other run's dtype (autocast or "
                               f"the cast as on the other side: a change to the script): "
                               f"{_should(src.share)}")], keys)
    if src.mechanism == "bf16_inputs":
        fw = cl.framework or "jax"
        fix = fix_for("bf16_inputs", fw) or "run the matmuls and convolutions in float32"
        if fw == "jax":
            lines = shell.record_command(argv, out, {"JAX_DEFAULT_MATMUL_PRECISION": "highest"})
            lines.append(shell.with_comment(shell.command("tracediff", "locate", other, out),
                                            _should(src.share)))
            return fix, lines, ["frameworks.jax.backend"]
        return fix, [], []
    causes = environment(result.env_diff, cl.op, cl.framework, cl.inputs_equal, cl.rv)
    _backend_first(d, causes)
    keys = [c.key for c in causes.causes[:3]]
    # a command only for the cause ranked first, where it is a variable a shell can set
    env_cause = causes.causes[0] if causes.causes and \
        causes.causes[0].key.startswith("env.") else None
    if env_cause is not None:
        var = env_cause.key[len("env."):]
        mine = env_cause.a if argv_side == "b" else env_cause.b   # the other side's value
        fix = f"the same {var} on both machines (a: {env_cause.a!s}, b: {env_cause.b!s})"
        if isinstance(mine, str):
            lines = shell.record_command(argv, out, {var: mine})
            lines.append(shell.with_comment(shell.command("tracediff", "locate", other, out),
                                            _should(src.share)))
        else:
            lines = [shell.comment(f"re-run {argv_side} with {var} unset, then locate again: "
                                   f"{_should(src.share)}")]
        return fix, lines, keys
    if causes.causes:
        c = causes.causes[0]
        if c.key == "frameworks.jax.backend":
            return (f"none on the command line: the backends compute it differently ({c.a} "
                    f"vs {c.b}); run it on one backend to compare values", [], keys)
        return (f"align {c.key} ({c.a} vs {c.b}) between the two machines", [], keys)
    st = result.structural
    if st is not None:   # an op only one run executed changed the values before this one
        return (f"none from the environment: it follows {st.text}, an op the other run did "
                f"not execute", [], [])
    return ("no recorded environment difference explains it (hardware, or a library loaded "
            "at run time)", [], [])


def _backend_first(d, causes):
    """JAX ops of two backends (a TPU against a CPU): the backend is the first cause of an
    op that computes differently, ahead of any path variable the machines also differ in."""
    backends = [((t.manifest or {}).get("frameworks") or {}).get("jax") or {}
                for t in (d.ta, d.tb)]
    ba, bb = (str(x.get("backend") or "") if isinstance(x, dict) else "" for x in backends)
    if not ba or not bb or ba == bb:
        return
    rest = [c for c in causes.causes if c.key != "frameworks.jax.backend"]
    causes.causes = [Cause(key="frameworks.jax.backend", a=ba, b=bb, rank=0, device=True,
                           reason="the op ran on two backends, whose kernels compute it "
                                  "differently")] + rest


def _ops_text(ops):
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops[:4]) + \
        (f", +{len(ops) - 4} more ops" if len(ops) > 4 else "")


def source_line(s):
    """One line for the terminal: share, mechanism, side, ops, where, how large."""
    who = "in RNG and initialiser ops" if s.mechanism == "initialiser" else \
        "in RNG ops drawing data" if s.mechanism == "random_data" else \
        f"({s.arguments})" if s.mechanism == "arguments" else \
        {"a": "on a", "b": "on b", "both": "introduced (inputs bitwise equal)"}.get(s.side, "")
    steps = "" if not s.steps else (f"step {s.steps[0]}" if s.steps[0] == s.steps[1] else
                                   f"steps {s.steps[0]}-{s.steps[1]}")
    mech = "random data" if s.mechanism == "random_data" else \
        "initialiser" if s.mechanism == "initialiser" else \
        "bf16 pass" if s.mechanism == "bf16_inputs" else \
        "another dtype" if s.mechanism == "dtype" else \
        "arguments differ" if s.mechanism == "arguments" else \
        s.mechanism.replace("implementation:", "implementation, ")
    local = ""
    if s.local_a is not None and s.local_b is not None and s.how == "adds":
        local = f"; local error a {s.local_a:.2g} / b {s.local_b:.2g}"
    share = f"{s.share:6.1%}" if s.share is not None else "     -"
    return (f"{share}  {mech} {who}: {_ops_text(s.ops)} in "
            f"{', '.join(s.modules[:3]) or '(top level)'}{' ...' if len(s.modules) > 3 else ''}"
            f"; {steps}; adds up to {s.added:.2g} rel{local}" if s.added is not None else
            f"{share}  {mech} {who}: {_ops_text(s.ops)}; {steps}")
