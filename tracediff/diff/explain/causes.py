"""Environment causes: which recorded differences between the two machines can change the
origin's kind of op, ranked.

The op is classed (`op_class`: matmul, transcendental, reduction, linear algebra, compiled,
elementwise); package versions of its framework and the settings known to change that
class (a kernel replaced from Python, start-up code and native libraries, instruction
set, TF32, BLAS, threads, fast math, x64) are picked from the manifest
differences (`explain/env.py`), each with the reason. Nothing is listed that is not in the
manifests; with none, the answer says the cause is elsewhere (hardware, a library loaded
at run time).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ..result import Cause, Causes, Inner, ReplayRun
from . import reasons
from .mechanisms.precision import fix_for, is_conv, ran_as_bf16_pass

# convolutions are matmuls here (`conv\w*` but not `convert_element_type`)
MATMUL = re.compile(r"^(aten::)?(dot|vdot|mm|addmm|bmm|baddbmm|addbmm|matmul|mv|addmv|linear|"
                    r"einsum|tensordot|dot_general|conv(?!ert_)\w*|_convolution\w*|addr|"
                    r"outer)(\.|$)")
TRANSCENDENTAL = re.compile(r"^(aten::)?(exp\w*|log\w*|tanh\w*|sigmoid\w*|logistic|sin|cos|tan|"
                            r"sinh|cosh|asin\w*|acos\w*|atan\w*|erf\w*|pow|sqrt|rsqrt|cbrt|gelu\w*|"
                            r"silu\w*|softplus|lgamma|digamma|"
                            r"expm\w*|matrix_exp)(\.|$)")
# sums of many terms, the normalisation layers (mean and variance) and softmax included
REDUCTION = re.compile(r"^(aten::)?(sum|nansum|mean|nanmean|reduce_(?!precision)\w+|cumsum|cumprod|"
                       r"cumlogsumexp|var|var_mean|std|std_mean|norm|linalg_vector_norm|prod|"
                       r"logsumexp|amax|amin|\w*_loss\w*|_?softmax\w*|_?log_softmax\w*|"
                       r"\w*(batch|layer|group|instance|rms)_norm\w*|_batch_norm_impl_index\w*|"
                       r"renorm|_weight_norm\w*)(\.|$)")
LINALG = re.compile(r"^(aten::)?(qr|lu|cholesky|eigh?|svd|triangular_solve|linalg_\w+|"
                    r"custom_linear_solve|householder_product|schur)(\.|$)")


def op_class(op: str) -> str:
    """matmul, transcendental, reduction, linear-algebra, compiled (a jit call) or
    elementwise: what an environment setting has to touch to change the op."""
    base = op.split(":", 1)[1] if op.startswith("jit:") else op
    for name, rx in (("matmul", MATMUL), ("reduction", REDUCTION),
                     ("transcendental", TRANSCENDENTAL), ("linear-algebra", LINALG)):
        if rx.match(base):
            return name
    if op.startswith("jit:"):
        return "compiled"
    return "elementwise"


# a path variable or a library that differs is common between machines: among them only
# math libraries rank high
_MATH_LIBRARY = re.compile(r"(libm\b|libm[.-]|libmvec|sleef|blas|lapack|mkl|dnnl|onednn|omp)",
                           re.I)
_FRAMEWORK_PACKAGES = {"jax": ("jax", "jaxlib", "jax-cuda", "jax_cuda", "ml_dtypes", "flax", "optax",
                               "scipy", "numpy"),
                       "torch": ("torch", "numpy", "mkl", "intel-openmp")}


def _xla_flag_causes(a, b, op, cls):
    """One cause per XLA flag whose setting differs, each with its own reason
    (`reasons.XLA_FLAG_REASONS`): "(unset)" where a side does not set it."""
    fa, fb = reasons.xla_flags(a), reasons.xla_flags(b)
    out = []
    for name in sorted(set(fa) | set(fb), key=lambda n: list(fa).index(n) if n in fa
                       else len(fa) + list(fb).index(n)):
        if fa.get(name) == fb.get(name):
            continue
        row = reasons.reason_for(name, cls, reasons.XLA_FLAG_REASONS)
        if row is None:
            continue

        def shown(flags):
            if name not in flags:
                return None
            return f"{name}={flags[name]}" if flags[name] else name

        out.append(Cause(key="env.XLA_FLAGS", a=shown(fa), b=shown(fb),
                         reason=f"{name}: {row.text}; {op} is a {cls} op",
                         rank=row.rank_for(cls)))
    return out


def _pkg_versions(diff):
    out = []
    for e in diff:
        k = e["key"]
        if e.get("category") == "package" and k.startswith("packages."):
            out.append((k[len("packages."):], e.get("a"), e.get("b")))
        elif k.startswith("frameworks.") and k.endswith(".version"):
            out.append((k.split(".")[1], e.get("a"), e.get("b")))
    return out


def environment(env_diff: list, op: str, framework: Optional[str], inputs_match: Optional[bool],
                replay: Optional[ReplayRun] = None, inner: Optional[Inner] = None) -> Causes:
    """The likely causes, ranked, drawn only from `env_diff` (nothing that is not in the
    manifests): package versions of the op's framework, then the settings known to change
    this class of op (`op_class`)."""
    cls = op_class(op)
    causes = []
    seen = set()
    for name, pkg_a, pkg_b in _pkg_versions(env_diff):
        if name in seen:
            continue
        seen.add(name)
        relevant = any(name.lower().startswith(p) for p in _FRAMEWORK_PACKAGES.get(framework, ()))
        if not relevant:
            continue
        if inputs_match is True:
            reason = (f"{op}'s inputs are equal and its outputs differ: its implementation (or "
                      f"the code the compiler generates for it) changed between {name} "
                      f"{pkg_a} and {pkg_b}")
            if inner and (inner.only_in_a or inner.only_in_b):
                reason += f" ({inner.text.split(':')[0]})"
            rank = 0 if name in ("jax", "jaxlib", "torch") else 2
        else:
            reason = (f"{name} {pkg_a} vs {pkg_b}; {op}'s inputs already differ, so the "
                      f"version difference acts earlier (see the origin)")
            rank = 4
        causes.append(Cause(key=f"packages.{name}", a=pkg_a, b=pkg_b, reason=reason, rank=rank))
    jax_op = framework in (None, "jax")   # XLA flags and JAX's device settings: JAX ops only
    for e in env_diff:
        k = e["key"]
        if k.startswith("packages.") or (k.startswith("frameworks.") and k.endswith(".version")):
            continue
        if e.get("category") in ("host", "script", "recording", "python", "os"):
            continue
        if k == "env.XLA_FLAGS":
            if jax_op:
                causes += _xla_flag_causes(e.get("a"), e.get("b"), op, cls)
            continue
        row = reasons.reason_for(k, cls)
        if row is None or (row.device and not jax_op):
            continue
        rank, why = row.rank_for(cls), row.text
        if row.tag == "startup" and not k.startswith("startup."):
            rank = 1 if _MATH_LIBRARY.search(k) and not k.startswith("env.") else 3
        if row.tag == "kernel":   # the origin op itself runs a replaced kernel: rank 0
            target = k.split(".python_kernels.", 1)[1]
            why = (f"{target} runs a kernel registered from Python on one side only: "
                   f"it replaces the library's kernel")
            if target.split(".")[0] == op.split(".")[0]:
                rank = 0
        if row.tag == "isa" and k == "cpu.model":
            rank = max(rank, 1)
        a, b = e.get("a"), e.get("b")
        if k == "cpu.isa_flags":
            a = ", ".join(e.get("numeric_only_in_a") or []) or "-"
            b = ", ".join(e.get("numeric_only_in_b") or []) or "-"
            if a == "-" and b == "-":
                continue
        causes.append(Cause(key=k, a=a, b=b, reason=f"{why}; {op} is a {cls} op",
                            rank=rank, device=row.device or None))
    if any(c.device for c in causes):   # the op ran on another device: host keys come after
        causes = [c if c.device else dataclasses.replace(c, rank=max(c.rank, 1))
                  for c in causes]
    causes.sort(key=lambda c: (c.rank, not c.device))
    if replay and replay.reproduces in ("a", "b") and causes:
        here = replay.reproduces
        other = "b" if here == "a" else "a"
        causes[0] = dataclasses.replace(
            causes[0], note=f"this machine reproduces {here} bitwise: {other}'s "
                            f"{causes[0].key} is the one that changes {op}")
    return Causes(op_class=cls, causes=causes,
                  none_found=None if causes else (
                      f"no recorded environment difference is known to affect {cls} ops; the "
                      f"cause is not in the manifests (e.g. hardware, a library loaded at run "
                      f"time)"))


def bf16_pass_cause(sides) -> Optional[Cause]:
    """The accelerator's numerics as the cause where the manifests cannot show it (one
    trace holding both frameworks, a Flax model and its torch port): one side's matmul (or
    convolution) ran
    on a TPU at default precision (one bf16 pass) and the other side's did not. `sides`:
    {side: (framework, backend, op, params, jax_default_matmul_precision)}."""
    bf16 = {s: fw == "jax" and ran_as_bf16_pass(backend, op, params, prec)
            for s, (fw, backend, op, params, prec) in sides.items()}
    if sorted(bf16.values()) != [False, True]:
        return None
    side = "a" if bf16["a"] else "b"
    other = "b" if side == "a" else "a"
    fw, backend, op, _, prec = sides[side]
    ofw, obackend, oop = sides[other][:3]
    kind = "convolution" if is_conv(op) else "matmul"
    return Cause(key="frameworks.jax.backend",
                 a=f"{sides['a'][0]} on {sides['a'][1] or 'cpu'}",
                 b=f"{sides['b'][0]} on {sides['b'][1] or 'cpu'}",
                 reason=f"{side}'s {op} ran on a TPU at default matmul precision "
                        f"(jax_default_matmul_precision {prec or 'unset'}): the chip computes a "
                        f"float32 {kind} as one bfloat16 pass (inputs rounded to bf16, float32 "
                        f"accumulation), {other}'s {oop} ({ofw} on {obackend or 'cpu'}) in "
                        f"float32; "
                        f"fix: {fix_for('bf16_inputs', 'jax')}", rank=0, device=True)

