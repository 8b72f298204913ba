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

MATMUL = re.compile(r"^(aten::)?(dot|vdot|mm|addmm|bmm|baddbmm|addbmm|matmul|mv|addmv|linear|"
                    r"einsum|tensordot|dot_general|conv\w*|_convolution\w*|addr|outer)(\.|$)")
TRANSCENDENTAL = re.compile(r"^(aten::)?(exp\w*|log\w*|tanh\w*|sigmoid\w*|logistic|sin|cos|tan|"
                            r"sinh|cosh|asin\w*|acos\w*|atan\w*|erf\w*|pow|sqrt|rsqrt|cbrt|gelu\w*|"
                            r"silu\w*|softplus|_?softmax\w*|_?log_softmax\w*|lgamma|digamma|"
                            r"expm\w*|matrix_exp)(\.|$)")
REDUCTION = re.compile(r"^(aten::)?(sum|mean|reduce_\w+|cumsum|cumprod|cumlogsumexp|var|std|norm|"
                       r"linalg_vector_norm|prod|logsumexp|amax|amin|\w*_loss\w*)(\.|$)")
LINALG = re.compile(r"^(aten::)?(qr|lu|cholesky|eigh?|svd|triangular_solve|linalg_\w+|"
                    r"custom_linear_solve|householder_product|schur)(\.|$)")


def op_class(op: str) -> str:
    """matmul, transcendental, reduction, linear-algebra, compiled (a jit call) or
    elementwise: what an environment setting has to touch to change the op."""
    base = op.split(":", 1)[1] if op.startswith("jit:") else op
    for name, rx in (("matmul", MATMUL), ("transcendental", TRANSCENDENTAL),
                     ("reduction", REDUCTION), ("linear-algebra", LINALG)):
        if rx.match(base):
            return name
    if op.startswith("jit:"):
        return "compiled"
    return "elementwise"


_ALL_CLASSES = {"matmul", "transcendental", "reduction", "linear-algebra", "elementwise",
                "compiled"}
_CAUSES = {
    # (category or key regex, op classes it can affect, reason)
    # an aten op whose kernel was replaced from Python (trace/manifest.dispatcher_overrides)
    "kernel": (re.compile(r"^frameworks\.\w+\.python_kernels\."), _ALL_CLASSES,
               "a kernel registered from Python replaces the library's kernel of this op"),
    "isa": (re.compile(r"^(cpu\.isa_flags|cpu\.model|env\.XLA_FLAGS|env\.MKL_ENABLE_INSTRUCTIONS|"
                       r"env\.MKL_CBWR|env\.ATEN_CPU_CAPABILITY|frameworks\.torch\.cpu_capability|"
                       r"env\.OPENBLAS_CORETYPE|env\.DNNL_MAX_CPU_ISA|env\.ONEDNN_MAX_CPU_ISA)"),
            {"matmul", "transcendental", "reduction", "linear-algebra", "elementwise", "compiled"},
            "instruction set / kernel selection: vector width and FMA change rounding"),
    "tf32": (re.compile(r"(tf32|matmul_precision|default_matmul_precision|allow_bf16|"
                        r"allow_fp16_reduced|precision)", re.I),
             {"matmul"}, "reduced-precision matmul setting (TF32 / bf16 passes)"),
    "blas": (re.compile(r"(MKL_|OPENBLAS|BLIS|blas|mkl|onednn|mkldnn|dnnl|lapack)", re.I),
             {"matmul", "linear-algebra", "reduction"}, "BLAS / oneDNN library or setting"),
    "threads": (re.compile(r"(threads|OMP_NUM|MKL_NUM|OPENBLAS_NUM|XLA_FLAGS)", re.I),
                {"matmul", "reduction", "linear-algebra"},
                "thread count changes the reduction order"),
    "fastmath": (re.compile(r"(fast_math|fastmath|xla_cpu_enable_fast|denormal|flush|ftz)", re.I),
                 {"transcendental", "elementwise", "reduction", "compiled", "matmul"},
                 "fast-math / denormal setting"),
    "x64": (re.compile(r"(x64|enable_x64|default_dtype|float64)", re.I),
            {"matmul", "transcendental", "reduction", "linear-algebra", "elementwise", "compiled"},
            "default precision"),
    # code and native libraries loaded besides the script (trace/manifest.py)
    "startup": (re.compile(r"^(env\.(PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|PYTHONUSERBASE|"
                           r"PYTHONNOUSERSITE|LD_PRELOAD|LD_LIBRARY_PATH|DYLD_\w+)$|startup\.|"
                           r"libraries\.|frameworks\.\w+\.libraries\.)"), _ALL_CLASSES,
                "code or native libraries loaded besides the script (a sitecustomize on "
                "PYTHONPATH, a preloaded or another BLAS/libm) can replace any op"),
}
# a path variable or a library that differs is common between machines: among them only
# math libraries rank high
_MATH_LIBRARY = re.compile(r"(libm\b|libm[.-]|libmvec|sleef|blas|lapack|mkl|dnnl|onednn|omp)",
                           re.I)
_FRAMEWORK_PACKAGES = {"jax": ("jax", "jaxlib", "jax-cuda", "jax_cuda", "ml_dtypes", "flax", "optax",
                               "scipy", "numpy"),
                       "torch": ("torch", "numpy", "mkl", "intel-openmp")}


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
    for e in env_diff:
        k = e["key"]
        if k.startswith("packages.") or (k.startswith("frameworks.") and k.endswith(".version")):
            continue
        if e.get("category") in ("host", "script", "recording", "python", "os"):
            continue
        for tag, (rx, classes, why) in _CAUSES.items():
            if rx.search(k) and cls in classes:
                rank = {"isa": 1, "tf32": 1, "blas": 2, "fastmath": 2, "threads": 3,
                        "x64": 2, "kernel": 2, "startup": 1}[tag]
                if tag == "startup" and not k.startswith("startup."):
                    rank = 1 if _MATH_LIBRARY.search(k) and not k.startswith("env.") else 3
                if tag == "kernel":   # the origin op itself runs a replaced kernel: rank 0
                    target = k.split(".python_kernels.", 1)[1]
                    why = (f"{target} runs a kernel registered from Python on one side only: "
                           f"it replaces the library's kernel")
                    if target.split(".")[0] == op.split(".")[0]:
                        rank = 0
                if tag == "tf32" and cls == "matmul":
                    rank = 0
                if tag == "isa" and cls in ("matmul", "transcendental"):
                    rank = 0 if k != "cpu.model" else 1
                a, b = e.get("a"), e.get("b")
                if k == "cpu.isa_flags":
                    a = ", ".join(e.get("numeric_only_in_a") or []) or "-"
                    b = ", ".join(e.get("numeric_only_in_b") or []) or "-"
                    if a == "-" and b == "-":
                        break
                causes.append(Cause(key=k, a=a, b=b, reason=f"{why}; {op} is a {cls} op",
                                    rank=rank))
                break
    causes.sort(key=lambda c: c.rank)
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
