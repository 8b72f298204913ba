"""Why a recorded environment difference can change an op: the one reason table of
`explain`'s likely causes (`explain/causes.py` ranks with it; docs/root-cause.md prints it).

Data, not code: `REASONS` lists each kind of manifest key (a regular expression on the
flattened key), the op classes it can change (`causes.op_class`), its rank per class
(0 first) and the reason shown. `XLA_FLAG_REASONS` does the same for each flag inside
`XLA_FLAGS`, which is split into its flags (`xla_flags`) so that every flag that differs
gets its own reason: fast math, device count, instruction set and kernel selection, threads,
or just "an XLA flag". The first row that matches a key (a flag) is its reason.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Optional

MATMUL, TRANSCENDENTAL, REDUCTION, LINALG = "matmul", "transcendental", "reduction", "linear-algebra"
ELEMENTWISE, COMPILED = "elementwise", "compiled"
ALL = frozenset({MATMUL, TRANSCENDENTAL, REDUCTION, LINALG, ELEMENTWISE, COMPILED})
ARITHMETIC = ALL - {LINALG}
SUMS = frozenset({MATMUL, REDUCTION, LINALG, COMPILED})   # ops whose summation order can change


@dataclasses.dataclass(frozen=True)
class Reason:
    """One row: keys matching `pattern` can change ops of `classes`, ranked `rank` (a class
    in `rank_by_class` ranks as given there), because of `text`."""

    tag: str
    pattern: str
    classes: frozenset
    rank: int
    text: str
    example: str = ""                  # a key (a flag) it explains: docs and tests/test_causes.py
    rank_by_class: tuple = ()          # ((class, rank), ...)
    device: bool = False               # the accelerator's numerics: ranked before host keys

    def rank_for(self, cls: str) -> int:
        return dict(self.rank_by_class).get(cls, self.rank)

    def matches(self, key: str) -> bool:
        return re.search(self.pattern, key) is not None


# manifest keys (first match wins; XLA_FLAGS is split into flags, see XLA_FLAG_REASONS)
REASONS = (
    Reason("kernel", r"^frameworks\.\w+\.python_kernels\.", ALL, 2,
           "a kernel registered from Python replaces the library's kernel of this op",
           example="frameworks.torch.python_kernels.aten::dot"),
    Reason("backend", r"^frameworks\.jax\.backend$", ALL, 0,
           "the backend that ran the op (cpu, gpu, tpu): another compiler and other hardware "
           "arithmetic (a TPU runs float32 matmuls as bfloat16 passes at default precision, "
           "float64 is emulated there)", device=True,
           example="frameworks.jax.backend"),
    Reason("device_kind", r"^frameworks\.jax\.device_kind$", ALL, 0,
           "the accelerator that ran the op: its arithmetic units and accumulation order",
           device=True,
           example="frameworks.jax.device_kind"),
    Reason("matmul_precision", r"^frameworks\.jax\.jax_default_matmul_precision$",
           frozenset({MATMUL, COMPILED}), 0,
           "default matmul precision: on TPU (and GPUs with TF32) float32 matmuls and "
           "convolutions run as one bfloat16 pass at the default, three at 'high', full float32 "
           "at 'highest'; fix: jax.default_matmul_precision(\"highest\") or "
           "jax_default_matmul_precision", rank_by_class=((COMPILED, 1),), device=True,
           example="frameworks.jax.jax_default_matmul_precision"),
    Reason("isa", r"^(cpu\.isa_flags|cpu\.model|env\.MKL_ENABLE_INSTRUCTIONS|env\.MKL_CBWR|"
                  r"env\.ATEN_CPU_CAPABILITY|frameworks\.torch\.cpu_capability|"
                  r"env\.OPENBLAS_CORETYPE|env\.DNNL_MAX_CPU_ISA|env\.ONEDNN_MAX_CPU_ISA)", ALL, 1,
           "instruction set / kernel selection: vector width and FMA change rounding",
           rank_by_class=((MATMUL, 0), (TRANSCENDENTAL, 0)),
           example="env.ATEN_CPU_CAPABILITY"),
    Reason("tf32", r"(?i)(tf32|matmul_precision|allow_bf16|allow_fp16_reduced|precision)",
           frozenset({MATMUL}), 0, "reduced-precision matmul setting (TF32 / bf16 passes)",
           example="frameworks.torch.cuda_matmul_allow_tf32"),
    Reason("threads", r"(?i)(^env\.\w*NUM_THREADS$|^env\.\w*MAXIMUM_THREADS$|"
                      r"^frameworks\.\w+\.(num_threads|parallel_info)$|intra_?op|^env\.OMP_THREAD_LIMIT$)", SUMS, 3,
           "thread count: how a reduction is split across threads and the partial sums "
           "combined changes the summation order", rank_by_class=((REDUCTION, 1),),
           example="env.OMP_NUM_THREADS"),
    Reason("cores", r"^(threads\.(cpu_count|affinity)|cpu\.count)$", SUMS, 4,
           "cores available: a default thread count follows them, and the thread count "
           "changes how a reduction is split",
           example="threads.affinity"),
    Reason("blas", r"(?i)(MKL_|OPENBLAS|BLIS|blas|mkl|onednn|mkldnn|dnnl|lapack)",
           frozenset({MATMUL, LINALG, REDUCTION}), 2, "BLAS / oneDNN library or setting",
           example="frameworks.torch.libraries.blas"),
    Reason("fastmath", r"(?i)(fast_math|fastmath|denormal|flush|ftz)", ARITHMETIC, 2,
           "fast-math / denormal setting",
           example="frameworks.torch.flush_denormal"),
    Reason("x64", r"(?i)(x64|enable_x64|default_dtype|float64)", ALL, 2, "default precision",
           example="frameworks.jax.jax_enable_x64"),
    # code and native libraries loaded besides the script (trace/manifest.py): math
    # libraries rank 1, path variables and other libraries 3 (they often differ for no
    # numeric reason; causes.py applies that split)
    Reason("startup", r"^(env\.(PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|PYTHONUSERBASE|"
                      r"PYTHONNOUSERSITE|LD_PRELOAD|LD_LIBRARY_PATH|DYLD_\w+)$|startup\.|"
                      r"libraries\.|frameworks\.\w+\.libraries\.)", ALL, 1,
           "code or native libraries loaded besides the script (a sitecustomize on "
           "PYTHONPATH, a preloaded or another BLAS/libm) can replace any op",
           example="startup.sitecustomize"),
)

# flags of XLA_FLAGS (first match wins on the flag's name)
XLA_FLAG_REASONS = (
    Reason("xla_fast_math", r"^--xla_(cpu|gpu)_(enable_)?fast_(math|min_max)|"
                            r"^--xla_cpu_fast_math_", ARITHMETIC, 1,
           "XLA fast math: reassociation (another summation order) and approximate functions "
           "(exp, tanh, division)", rank_by_class=((TRANSCENDENTAL, 0),),
           example="--xla_cpu_enable_fast_math"),
    Reason("xla_device_count", r"^--xla_force_host_platform_device_count$", SUMS | {ELEMENTWISE}, 1,
           "device count / partitioning: how many host devices a program is split across "
           "changes how a reduction is split and its partial sums combined",
           rank_by_class=((REDUCTION, 0),),
           example="--xla_force_host_platform_device_count"),
    Reason("xla_threads", r"^--xla_cpu_multi_thread_eigen$|intra_op_parallelism|"
                          r"^--xla_cpu_parallel", SUMS, 1,
           "XLA's intra-op threading: how a matmul or reduction is split across threads",
           example="--xla_cpu_multi_thread_eigen"),
    Reason("xla_isa", r"^--xla_cpu_(max_isa|use_thunk_runtime|prefer_vector_width|use_xnnpack|"
                      r"use_mkl_dnn|use_acl|enable_mlir|use_fusion_emitters|"
                      r"enable_concurrency_optimized_scheduler|use_onednn)|"
                      r"^--xla_(cpu|gpu)_enable_(triton|cublaslt|cudnn)|^--xla_gpu_autotune|"
                      r"^--xla_llvm_|^--xla_backend_optimization_level", ALL, 1,
           "instruction set / kernel selection: the code XLA generates or the library kernel "
           "it calls (vector width, FMA) changes rounding",
           rank_by_class=((MATMUL, 0), (TRANSCENDENTAL, 0)),
           example="--xla_cpu_max_isa"),
    Reason("xla_determinism", r"^--xla_gpu_(deterministic_ops|exclude_nondeterministic_ops)",
           SUMS, 1, "XLA's deterministic kernels: atomics change the summation order",
           example="--xla_gpu_deterministic_ops"),
    Reason("xla_debug", r"^--xla_(dump|hlo_profile|log|dump_)", ALL, 6,
           "an XLA flag that writes debugging output; it changes no numbers",
           example="--xla_dump_to"),
    Reason("xla_other", r"^--", ALL, 2, "an XLA flag",
           example="--xla_cpu_copy_insertion_use_region_analysis"),
)


def xla_flags(value: Optional[str]) -> dict:
    """`--name=value` flags of an XLA_FLAGS string as {name: value} ("" for a bare flag;
    the last setting of a flag wins, as in XLA). An unparsable string is split on spaces."""
    if not value:
        return {}
    try:
        words = shlex.split(str(value))
    except ValueError:
        words = str(value).split()
    out = {}
    for w in words:
        name, _, val = w.partition("=")
        if name:
            out[name] = val
    return out


def reason_for(key: str, cls: str, table=REASONS) -> Optional[Reason]:
    """The first row of `table` whose pattern matches `key` and that can change `cls` ops
    (None: no row knows the key, or none that can change such an op)."""
    for row in table:
        if cls in row.classes and row.matches(key):
            return row
    return None
