"""Mechanism hypotheses: which candidate numerics reproduce each side of a divergence.

The replay verdict (explain/replay/, explain/verdict.py) says whether *this machine* reproduces a or b.
A mechanism says *how* a side computed its value: candidate numerics of the origin op are
re-executed here, in numpy, on each side's own recorded inputs, and each candidate is
compared with that side's recorded output, bitwise or in ULP of the output dtype:

    b's aten::addmm is reproduced bitwise by TF32-rounded inputs (an Ampere GPU ...)

Data-driven: `FAMILIES` maps each op family (matmul, convolution, reduction, division,
transcendental, fused expression) to the hypotheses that apply to it, and `HYPOTHESES`
maps each hypothesis name to its description and the function that yields its candidate
results (one per variant: summation order, where the bias is added, rounding mode); the
best variant of each hypothesis is reported. Adding a hypothesis is one function and
one row in each table. docs/root-cause.md describes each one.

Honest by construction: a hypothesis is reported as `bitwise` only when its candidate
equals the recorded output bit for bit on every compared element (all of them, or an
evenly spaced sample of `MAX_ELEMENTS` for large outputs: the note says so); otherwise
`max_ulp` says how close it came, and "no hypothesis reproduces it" is a valid answer.
Exact arithmetic where it matters: a float32 fused multiply-add is computed in float64
rounded to odd (correct for every input), a float64 one by the Boldo-Melquiond
emulation; products of TF32/bfloat16/float16-rounded float32 operands are exact in
float32, as on the hardware.

`expression` finds the fused expression a compiled-probe op ends (`t * rate + offset`
for the probed `add`): the XLA program may have computed it as one fused operation, so
its exact reference is the expression evaluated from its original operands
(`Expr.exact`), not the last op applied to the already rounded product.

The modules: `dispatch.py` (the tables and the ranking), `problems.py` (the op rewritten
for the hypotheses), one module per family of hypotheses (`precision.py`: TF32/bf16/fp16
inputs and the TPU's bf16 pass; `summation.py`: summation order, FMA, accumulation width;
`elementwise.py`: correct rounding and the reciprocal; `denormals.py`; `expression.py`:
fused expressions of compiled probes), `numerics.py` (exact arithmetic and ULP distance)
and `summary.py` (the one line).
"""
