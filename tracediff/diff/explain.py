"""Root cause of a divergence: origin, chain, replay verdict, environment, growth.

`analyse(result, differ, event=None)` returns one JSON-ready dict (`tracediff explain
--json`); `short(analysis)` is the part `locate` adds to its own result (`explain`,
`chain`). Pieces:

* origin: the event to explain (EVENT, or the first difference beyond tolerance when its
  inputs match, else the first bitwise difference: the op that introduced it).
* chain (`chain.py`): dataflow path origin -> first beyond tolerance -> last differing
  event, with the amplification at each hop.
* replay: the origin op re-executed here from each side's recorded inputs
  (`replay.py`), in its own dtype (does this machine reproduce a, b, neither?) and in
  higher precision (float64 for float32/16 ops; numpy long double for float64 ops), and
  how many ULP each side's recorded output is from that oracle.
* environment: the manifest differences that can change this kind of op, ranked, each
  with the reason; nothing is listed that is not in the manifests.
* steps: per optimizer step, the worst relative difference of the parameters and of
  the loss (the last scalar float output of the step's forward computation).
"""

import dataclasses
import os
import re

import numpy as np

from ..errors import TraceError
from ..shell import command
from ..trace import schema
from ..untrusted import markup
from . import chain as _chain
from . import compare
from . import levels as _levels
from . import mechanisms as _mechanisms
from . import replay as _replay
from .differ import comparable, input_value_row

MAX_REPLAY_BYTES = 64 << 20

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


def op_class(op):
    base = op.split(":", 1)[1] if op.startswith("jit:") else op
    for name, rx in (("matmul", MATMUL), ("transcendental", TRANSCENDENTAL),
                     ("reduction", REDUCTION), ("linear-algebra", LINALG)):
        if rx.match(base):
            return name
    if op.startswith("jit:"):
        return "compiled"
    return "elementwise"


# -- replay verdict ---------------------------------------------------------------------------

def _side(d, side):
    return (d.ta, d.sa, d.ra) if side == "a" else (d.tb, d.sb, d.rb)


def event_inputs(d, side, ev):
    """Array inputs of event `ev` of one side, in slot order (raises CannotReplay)."""
    t, s, reader = _side(d, side)
    return trace_inputs(t, s, reader, ev)


def trace_inputs(t, s, reader, ev):
    """Array inputs of event `ev` of trace `t` (Side `s`, ValueReader `reader`)."""
    arrays, total = [], 0
    for r in t.input_rows(ev):
        slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
        if slot != len(arrays):
            raise _replay.CannotReplay(f"input slot {len(arrays)} is not recorded")
        if p == schema.PRODUCER_LITERAL:
            row = s.value_row(ev, slot, schema.ROLE_IN)   # stored since tracediff 0.1 (JAX)
            if row is None or not comparable(row):
                raise _replay.CannotReplay(f"input {slot} is a literal of the program; its "
                                           f"value is not recorded")
            arrays.append(reader.read(row))
            continue
        if p == schema.PRODUCER_CONST:
            raise _replay.CannotReplay(f"input {slot} is a closed-over constant; its value is "
                                       f"not recorded")
        if p < 0:
            raise _replay.CannotReplay(f"input {slot} has an unknown producer")
        row = input_value_row(s, t, ev, p, ps)
        if row is None or not comparable(row):
            raise _replay.CannotReplay(f"input {slot} (from event {p}) was not stored")
        total += int(row["nbytes"])
        if total > MAX_REPLAY_BYTES:
            raise _replay.CannotReplay("inputs larger than 64 MB are not replayed")
        arrays.append(reader.read(row))
    return arrays


def event_outputs(d, side, ev):
    t, _, reader = _side(d, side)
    rows = t.value_rows(ev, schema.ROLE_OUT)
    rows = rows[np.argsort(rows["slot"], kind="stable")]
    return [reader.read(r) if comparable(r) else None for r in rows]


def _bits_equal(x, y):
    if x is None or y is None:
        return False
    x, y = np.asarray(x), np.asarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _real_parts(x):
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return [x.real, x.imag]
    return [x]


def oracle_distance(recorded, oracle):
    """{max_ulp (integer, to the rounded oracle), max_ulp_exact (|x - exact| in units of
    the last place), max_rel, sum_abs} of a recorded output against a high-precision
    result, in the recorded dtype."""
    rec = np.asarray(recorded)
    name = rec.dtype.name
    if not compare.is_floating(name) or rec.shape != np.asarray(oracle).shape:
        return None
    out = {"max_ulp": 0.0, "max_ulp_exact": 0.0, "mean_ulp_exact": 0.0, "max_rel": 0.0,
           "sum_abs": 0.0}
    for r, o in zip(_real_parts(rec), _real_parts(np.asarray(oracle))):
        part = r.dtype.name
        with np.errstate(all="ignore"):
            rounded = o.astype(np.float64).astype(r.dtype) if part == "bfloat16" else o.astype(r.dtype)
            both_nan = np.isnan(r.astype(np.float64)) & np.isnan(o.astype(np.float64))
            u = compare.ulp_distance(r.reshape(-1), rounded.reshape(-1), part)
            u = np.where(both_nan.reshape(-1), 0.0, u)
            wide = o.astype(np.float64).astype(np.longdouble) if o.dtype.name == "bfloat16" \
                else o.astype(np.longdouble)
            err = np.abs(r.astype(np.float64).astype(np.longdouble) - wide)
            err = np.where(both_nan, 0, err)
            if part in ("float16", "float32", "float64"):
                spacing = np.abs(np.spacing(np.abs(rounded))).astype(np.longdouble)
                exact = np.where(spacing > 0, err / spacing, 0)
            else:
                exact = None
            scale = np.abs(wide)
            rel = np.where(err == 0, 0, err / np.where(scale == 0, 1, scale))
        if u.size:
            out["max_ulp"] = max(out["max_ulp"], float(np.nanmax(u)) if not np.isnan(u).all()
                                 else float("inf"))
            out["max_rel"] = max(out["max_rel"], float(np.max(rel)))
            out["sum_abs"] += float(np.sum(err))
            out["max_ulp_exact"] = None if exact is None or out["max_ulp_exact"] is None else \
                max(out["max_ulp_exact"], float(np.max(exact)))
            out["mean_ulp_exact"] = None if exact is None or out["mean_ulp_exact"] is None else \
                max(out["mean_ulp_exact"], float(np.mean(exact)))
    return out


def replay_verdict(d, ea, eb):
    """Re-execute the op of a paired event on this machine; see the module docstring."""
    ev = {"a": d.ta.event(ea), "b": d.tb.event(eb)}
    res = {"event": {"a": ea, "b": eb, "op": ev["a"]["op"], "op_b": ev["b"]["op"]},
           "replayed": False}
    if ev["a"]["kind"] == "call" or ev["b"]["kind"] == "call":
        res["reason"] = ("a compiled jit call is not replayed as one op: its equations are "
                         "(see the chain and the note on compiled-call divergences)")
        res["verdict"] = f"not replayed: {ev['a']['op']} is a compiled call"
        return res
    sides = {}
    for side, e, idx in (("a", ev["a"], ea), ("b", ev["b"], eb)):
        info = {"op": e["op"], "framework": e["framework"]}
        try:
            if e["kind"] not in ("eqn", "eager", "op"):
                raise _replay.CannotReplay(f"a {e['kind']} event is not an op")
            inputs = event_inputs(d, side, idx)
            call = _replay.build_call(e["framework"], e["op"], e["params"], len(inputs),
                                      _replay.recorded_output_size(_side(d, side)[0], idx))
            recorded = event_outputs(d, side, idx)
            info.update(call=call, inputs=inputs, recorded=recorded, n_inputs=len(inputs))
            try:
                here = call.run(inputs)
            except _replay.CannotReplay:
                raise
            except Exception as exc:
                raise _replay.CannotReplay(f"running it here failed ({type(exc).__name__}: "
                                           f"{str(exc).splitlines()[0][:120] if str(exc) else ''})")
            info["here"] = here
            info["reproduced"] = len(here) == len(recorded) and all(
                _bits_equal(h, r) for h, r in zip(here, recorded))
        except _replay.CannotReplay as exc:
            info["reason"] = str(exc)
        except Exception as exc:  # a damaged value, an odd op: never fail the report
            info["reason"] = f"cannot replay: {type(exc).__name__}: {str(exc)[:120]}"
        sides[side] = info
    ok = [s for s in ("a", "b") if "call" in sides[s] and "here" in sides[s]]
    res["a"] = {"op": sides["a"]["op"], "replayed": "here" in sides["a"],
                "reproduced_here": sides["a"].get("reproduced"), "reason": sides["a"].get("reason")}
    res["b"] = {"op": sides["b"]["op"], "replayed": "here" in sides["b"],
                "reproduced_here": sides["b"].get("reproduced"), "reason": sides["b"].get("reason")}
    if not ok:
        res["reason"] = sides["a"].get("reason") or sides["b"].get("reason")
        res["verdict"] = f"cannot replay {ev['a']['op']}: {res['reason']}"
        return res
    res["replayed"] = True
    # the oracle: from the side whose op covers most of the computation (most inputs)
    src = max(ok, key=lambda s: (sides[s]["n_inputs"], s == "a"))
    S = sides[src]
    out_dtype = next((np.asarray(r).dtype.name for r in S["recorded"] if r is not None), "")
    oracle, how = None, None
    # mechanisms (diff/mechanisms.py): candidate numerics re-run on each side's inputs; a
    # fused (compiled-probe) origin is judged against its whole expression, exactly
    cases = _mechanisms.cases(d, {"a": ea, "b": eb}, sides, event_inputs)
    expr = getattr(cases.get(src), "expr", None)
    try:
        if expr is not None and out_dtype in ("float16", "bfloat16", "float32", "float64"):
            shape = np.shape(next(r for r in S["recorded"] if r is not None))
            oracle = [np.broadcast_to(expr.exact(), shape)]
            how = "numpy long double" if out_dtype == "float64" else "float64"
        elif out_dtype in ("float64", "complex128"):
            oracle = _replay.numpy_oracle(S["framework"], S["op"], S["call"].params, S["inputs"])
            how = "numpy long double" if oracle is not None else None
            if oracle is None:
                res["oracle_note"] = (f"{S['op']} already computes in {out_dtype} and has no "
                                      f"extended-precision implementation here")
        elif compare.is_floating(out_dtype):
            oracle, how = S["call"].run(S["inputs"], upcast=True), "float64"
    except Exception as exc:
        res["oracle_note"] = f"the high-precision run failed ({type(exc).__name__})"
        oracle = None
    res["oracle"] = {"computed_by": how, "from": src, "op": S["op"]} if how else None
    if how and expr is not None:
        res["oracle"].update(op=expr.text(), expression=True)
    if oracle is not None:
        for side in ("a", "b"):
            rec = sides[side].get("recorded") or event_outputs(d, side, ea if side == "a" else eb)
            dist = [oracle_distance(r, o) if r is not None else None
                    for r, o in zip(rec, oracle)]
            dist = [x for x in dist if x is not None]
            if all(r is not None and np.asarray(r).size and not np.any(np.asarray(r))
                   for r in rec) and any(np.any(np.asarray(o)) for o in oracle):
                res[side]["returned_zero"] = True
            if dist:
                res[side]["from_oracle"] = {
                    "max_ulp": max(x["max_ulp"] for x in dist),
                    "max_ulp_exact": None if any(x["max_ulp_exact"] is None for x in dist)
                    else max(x["max_ulp_exact"] for x in dist),
                    "mean_ulp_exact": None if any(x["mean_ulp_exact"] is None for x in dist)
                    else max(x["mean_ulp_exact"] for x in dist),
                    "max_rel": max(x["max_rel"] for x in dist),
                    "sum_abs": sum(x["sum_abs"] for x in dist)}
        fa, fb = res["a"].get("from_oracle"), res["b"].get("from_oracle")
        if fa and fb:
            if fa["sum_abs"] == fb["sum_abs"]:
                res["closer"] = "equal"
            else:
                res["closer"] = "a" if fa["sum_abs"] < fb["sum_abs"] else "b"
    ra, rb = res["a"].get("reproduced_here"), res["b"].get("reproduced_here")
    res["reproduces"] = ("both" if ra and rb else "a" if ra else "b" if rb else
                         "neither" if ra is False or rb is False else None)
    res["machine"] = _machine(sides[src]["framework"])
    mechs = _mechanisms.hypotheses(cases)
    res["mechanisms"] = [dataclasses.asdict(m) for m in mechs]
    res["mechanism"] = _mechanisms.summary(mechs, {s: sides[s]["op"] for s in ("a", "b")})
    res["verdict"] = _verdict_text(res)
    return res


def _machine(framework):
    """What this machine replays with (for the verdict's 'this machine')."""
    import platform

    out = {"host": platform.node(), "numpy": np.__version__}
    try:
        if framework == "jax":
            import jax

            out["jax"] = jax.__version__
            out["XLA_FLAGS"] = os.environ.get("XLA_FLAGS")
        elif framework == "torch":
            import torch

            out["torch"] = torch.__version__
            out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # informative only
        pass
    return out


def _fmt(x):
    if x is None:
        return "-"
    x = float(x)
    if not np.isfinite(x):
        return "inf" if x > 0 else "nan"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.3g}"


def _ulp_text(f):
    if f.get("max_rel") == 0:
        return "0 ULP (exact)"
    if f.get("max_ulp_exact") is not None and f["max_ulp"] < 1e4:
        return f"max {f['max_ulp_exact']:.2f} ULP, mean {f['mean_ulp_exact']:.2f} ULP"
    return f"up to {_fmt(f['max_ulp'])} ULP"


def _verdict_text(res):
    parts = []
    fa, fb = res["a"].get("from_oracle"), res["b"].get("from_oracle")
    oracle = res.get("oracle") or {}
    if fa and fb:
        ref = f"{oracle.get('computed_by')} result"
        if oracle.get("expression"):   # a fused op: the exact value of the whole expression
            ref = (f"exact value of {oracle['op']} (in {oracle.get('computed_by')}, from the "
                   f"fused expression's original operands)")
        if res.get("closer") == "equal":
            parts.append(f"a and b are equally far from the {ref} "
                         f"({_fmt(fa['max_ulp'])} ULP)")
        else:
            win, lose = res["closer"], "b" if res["closer"] == "a" else "a"
            fw, fl = res[win]["from_oracle"], res[lose]["from_oracle"]
            parts.append(f"{win} is closer to the {ref}: {lose} is off by "
                         f"{_ulp_text(fl)} (max rel {_fmt(fl['max_rel'])}"
                         f"{f'; {lose} returned 0' if res[lose].get('returned_zero') else ''}), "
                         f"{win} by {_ulp_text(fw)}")
    elif res.get("oracle_note"):
        parts.append(f"no exact reference ({res['oracle_note']})")
    rep = res.get("reproduces")
    if rep == "a":
        parts.append("this machine reproduces a bitwise, not b")
    elif rep == "b":
        parts.append("this machine reproduces b bitwise, not a")
    elif rep == "both":
        parts.append("this machine reproduces both from their own inputs")
    elif rep == "neither":
        parts.append("this machine reproduces neither a nor b")
    return "; ".join(parts) if parts else "replayed, no verdict"


# -- environment ------------------------------------------------------------------------------

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


def environment(env_diff, op, framework, inputs_match, replay=None, inner=None):
    """Ranked likely causes [{key, a, b, reason, rank}] drawn only from `env_diff`."""
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
            if inner and (inner.get("only_in_a") or inner.get("only_in_b")):
                reason += f" ({inner['text'].split(':')[0]})"
            rank = 0 if name in ("jax", "jaxlib", "torch") else 2
        else:
            reason = (f"{name} {pkg_a} vs {pkg_b}; {op}'s inputs already differ, so the "
                      f"version difference acts earlier (see the origin)")
            rank = 4
        causes.append({"key": f"packages.{name}", "a": pkg_a, "b": pkg_b, "reason": reason,
                       "rank": rank})
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
                    # a path variable or a library that differs is common between machines:
                    # ranked high only for math libraries (libm, BLAS, OpenMP, oneDNN)
                    rank = 1 if re.search(r"(libm\b|libm[.-]|libmvec|sleef|blas|lapack|mkl|dnnl|"
                                          r"onednn|omp)", k, re.I) and not k.startswith("env.") \
                        else 3
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
                causes.append({"key": k, "a": a, "b": b,
                               "reason": f"{why}; {op} is a {cls} op", "rank": rank})
                break
    causes.sort(key=lambda c: c["rank"])
    if replay and replay.get("reproduces") in ("a", "b") and causes:
        here = replay["reproduces"]
        other = "b" if here == "a" else "a"
        causes[0] = dict(causes[0], note=f"this machine reproduces {here} bitwise: {other}'s "
                                         f"{causes[0]['key']} is the one that changes {op}")
    return {"op_class": cls, "causes": causes,
            "none_found": None if causes else (
                f"no recorded environment difference is known to affect {cls} ops; the cause "
                f"is not in the manifests (e.g. hardware, a library loaded at run time)")}


# -- divergence over time ---------------------------------------------------------------------

_CONSTANT_OPS = re.compile(r"^(aten::)?(ones|zeros|full|fill|empty|scalar_tensor|arange|linspace|"
                           r"rand|randn|randint|normal|uniform|bernoulli|lift|new_|iota|"
                           r"broadcast_in_dim$)")


def steps_table(d, result):
    """Per optimizer step: params max rel (from locate) and the loss of a and b."""
    rows = {r["step"]: dict(r) for r in result.optimizer_steps}
    t = d.ta
    ev = t.events
    n = len(ev)
    if not n:
        return list(rows.values())
    kinds = ev["kind"].astype(np.int64)
    phase = ev["phase"].astype(np.int64)
    cand = np.flatnonzero(np.isin(kinds, (schema.KIND_CALL, schema.KIND_OP, schema.KIND_EAGER)) &
                          (phase == schema.PHASE_FWD) & (d.al.a2b >= 0))
    vals = t.values
    out0 = vals[(vals["role"] == schema.ROLE_OUT)]
    scalar = np.zeros(n, bool)
    shape_empty = np.array([t.string(s) == "" for s in out0["shape"]], bool) if len(out0) else \
        np.zeros(0, bool)
    isfloat = np.array([t.string(x).startswith("float") for x in out0["dtype"]], bool) \
        if len(out0) else np.zeros(0, bool)
    ok = shape_empty & isfloat & ((out0["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT))
                                  == 0)
    scalar[out0["event"][ok].astype(np.int64)] = True
    cand = cand[scalar[cand]]
    # constants are not a loss: the backward seed (ones_like), fills, factories
    const = np.array([bool(_CONSTANT_OPS.match(t.string(o))) for o in ev["op"][cand]], bool) \
        if len(cand) else np.zeros(0, bool)
    cand = cand[~const]
    steps = ev["step"].astype(np.int64)
    for s in np.unique(steps[cand]).tolist():
        ea = int(cand[steps[cand] == s][-1])
        eb = int(d.al.a2b[ea])
        rows_a = [r for r in t.value_rows(ea, schema.ROLE_OUT) if t.string(r["shape"]) == ""]
        rows_b = [r for r in d.tb.value_rows(eb, schema.ROLE_OUT) if d.tb.string(r["shape"]) == ""]
        if not rows_a or not rows_b:
            continue
        # the last scalar output (a train step returns (..., loss))
        ra_, rb_ = rows_a[-1], rows_b[-1]
        xa, xb = d.ra.read(ra_), d.rb.read(rb_)
        if xa is None or xb is None:
            continue
        la, lb = float(np.real(xa)), float(np.real(xb))
        rel = abs(la - lb) / max(abs(la), abs(lb)) if la != lb and max(abs(la), abs(lb)) else 0.0
        row = rows.setdefault(s, {"step": s})
        e = t.event(ea)
        row["loss"] = {"a": la, "b": lb, "rel": rel, "event": ea, "op": e["op"],
                       "source": e["source"]}
    return [rows[k] for k in sorted(rows)]


# -- the whole analysis -----------------------------------------------------------------------

def _culprit(result):
    """The origin to explain: the first bitwise difference when it is introduced there
    (inputs bitwise equal), else the first difference beyond tolerance when its inputs
    are within tolerance, else the first difference."""
    f, fd = result.first_beyond_tolerance, result.first_difference
    if fd is not None and fd.inputs_match is True:
        return fd
    if f is not None and f.inputs_match is True:
        return f
    return fd or f


def analyse(result, d, event=None):
    """The full analysis as a JSON-ready dict (see the module docstring)."""
    out = {"verdict": result.verdict, "traces": result.traces, "tolerance": result.tolerance}
    if event is not None:
        if not 0 <= event < len(d.ta):
            raise TraceError(f"no event {event} in trace a (it has events 0 to {len(d.ta) - 1})")
        eb = int(d.al.a2b[event])
        if eb < 0:
            raise TraceError(f"event {event} of a has no counterpart in b (the runs executed "
                             f"different ops there); pick a paired event")
        f = d.finding(event, eb, "bitwise")
        f.note = "chosen on the command line"
    else:
        f = _culprit(result)
    if f is None:
        out["origin"] = None
        out["summary"] = "the traces match bitwise: nothing to explain"
        out["steps"] = steps_table(d, result)
        return out
    ea, eb = f.a["index"], f.b["index"]
    out["origin"] = {"a": {k: f.a.get(k) for k in ("index", "op", "kind", "origin", "name_stack",
                                                   "source", "step", "framework", "phase")},
                     "b": {k: f.b.get(k) for k in ("index", "op", "kind", "framework")},
                     "level": f.level, "inputs_match": f.inputs_match,
                     "inputs_reason": f.inputs_reason, "note": f.note, "call": f.call,
                     "metrics": {k: (f.metrics or {}).get(k) for k in
                                 ("max_rel", "max_abs", "max_ulp", "within_tolerance")}}
    fb = result.first_beyond_tolerance
    target = fb.a["index"] if fb is not None else None
    try:
        links, info = _chain.build(d, ea, target)
    except Exception as exc:  # never fail the analysis over the chain
        links, info = [], {"error": f"{type(exc).__name__}: {exc}"[:200]}
    out["chain"] = links
    out["chain_info"] = info
    out["replay"] = replay_verdict(d, ea, eb)
    out["mechanisms"] = out["replay"].pop("mechanisms", [])   # diff/mechanisms.py
    if f.compiled:
        step = int(f.a["step"])
        probe = command("tracediff", "record", "--probe", _levels.probe_pattern(f.a["op"]),
                        "--steps", f"{step}:{step + 1}")
        out["compiled_call"] = {
            "call": f.a["op"], "event": ea,
            "explanation": "the compiled outputs differ while every replayed equation matches: "
                           "the difference comes from how the program was compiled (fusion, "
                           "algebraic rewrites, fast math), not from any single op",
            "narrow": f"record the call's compiled probe on both machines ({probe} ..., the "
                      f"commands are in locate's next steps) and locate again: it names "
                      f"the equation whose compiled value differs"
                      if f.compiled == "replay matches" else
                      "done: the call's compiled probe was recorded on both sides and matches, so "
                      "the difference lies in how the whole program was fused, not in any one "
                      "equation's compiled value"}
    elif (f.call or {}).get("probe_a") is not None:
        rv = out["replay"] or {}
        alone = {"a": "b's", "b": "a's"}.get(rv.get("reproduces"))
        out["compiled_call"] = {
            "call": f.call["op"], "event": f.call["a"], "probe": f.call["probe_a"],
            "narrowed_to": {"op": f.a["op"], "event": ea},
            "explanation": f"every replayed equation of {f.call['op']} matches; its compiled "
                           f"probe narrows the difference to {f.a['op']} (a #{ea}), whose "
                           f"compiled value differs while its inputs match" +
                           (f". Run alone, {f.a['op']} gives {rv['reproduces']}'s value here: "
                            f"{alone} compiled program computes it differently (fused with "
                            f"its neighbours, e.g. a multiply-add contracted into one FMA, "
                            f"or vectorised code that rounds differently)" if alone else ""),
            "narrow": "done: the probe values are compiled intermediates (origin probe)"}
    if f.a.get("kind") in ("eqn", "call") and f.a["op"].startswith("jit:"):
        out["inner"] = _inner_structure(d, ea, eb)
    rv = out["replay"]
    env_op, env_fw = f.a["op"], f.a.get("framework")
    if (rv.get("oracle") or {}).get("from") == "b":   # b's op covers more (addmm vs add)
        env_op, env_fw = f.b["op"], f.b.get("framework")
    out["environment"] = environment(result.env_diff, env_op, env_fw, f.inputs_match, rv,
                                     out.get("inner"))
    if fb is not None and fb.a["index"] != ea and fb.inputs_match is True:
        out["tolerance_origin"] = {
            "index": fb.a["index"], "op": fb.a["op"], "step": fb.a["step"],
            "source": fb.a.get("source"), "inputs_reason": fb.inputs_reason,
            "max_rel": (fb.metrics or {}).get("max_rel")}
    out["steps"] = steps_table(d, result)
    out["noise"] = getattr(result, "noise", None)
    out["summary"] = _summary(out, f, info, links)
    return out


def _inner_structure(d, ea, eb):
    """How the equations inside a (nested) jit origin pair up: unpaired ones mean the
    function's jaxpr differs between the runs (another library version's implementation)."""
    def descendants(side, ev):
        out, frontier = [], np.array([ev])
        for _ in range(32):
            kids = np.flatnonzero(np.isin(side.parent, frontier))
            kids = kids[kids != ev]
            if not len(kids):
                break
            out.append(kids)
            frontier = kids
        return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)

    in_a, in_b = descendants(d.sa, ea), descendants(d.sb, eb)
    only_a = int(np.count_nonzero(d.al.a2b[in_a] < 0)) if len(in_a) else 0
    only_b = int(np.count_nonzero(d.al.b2a[in_b] < 0)) if len(in_b) else 0
    paired = in_a[d.al.a2b[in_a] >= 0] if len(in_a) else in_a
    diff = _chain.differing_mask(d)
    differing = sum(1 for e in paired.tolist() if diff[e])
    if only_a or only_b:
        text = (f"its equations differ between the runs ({len(in_a)} in a, {len(in_b)} in b; "
                f"{only_a} only in a, {only_b} only in b): the function itself is implemented "
                f"differently")
    elif differing:
        text = f"{differing} of its {len(in_a)} equations differ (see the chain)"
    else:
        text = (f"all {len(in_a)} equations inside it pair up and match: the difference comes "
                f"from how it was compiled")
    return {"equations_a": int(len(in_a)), "equations_b": int(len(in_b)), "only_in_a": only_a,
            "only_in_b": only_b, "differing": differing, "text": text}


def _summary(out, f, info, links):
    e = f.a
    where = f"{e['op']} (a #{e['index']}, step {e['step']}" + \
        (f", {e['source']}" if e.get("source") else "") + ")"
    words = []
    if f.inputs_match is True:
        words.append(f"{where} introduced the difference: its inputs are "
                     f"{'bitwise equal' if f.level == 'bitwise' else 'within tolerance'} and "
                     f"its outputs differ (max {_fmt((f.metrics or {}).get('max_ulp'))} ULP)")
    elif f.inputs_match is False:
        words.append(f"{where} differs but inherits the difference from its inputs")
    else:
        words.append(f"{where} differs; whether it introduced the difference is unknown "
                     f"({f.inputs_reason})")
    to = out.get("tolerance_origin")
    if to:
        words.append(f"it first exceeds tolerance at {to['op']} (a #{to['index']}, step "
                     f"{to['step']}), whose inputs are within tolerance: that op magnified it to "
                     f"{_fmt(to['max_rel'])}")
    st = info.get("strongest") if isinstance(info, dict) else None
    if st:
        words.append(f"{st['op']} (a #{st['index']}) amplified a {_fmt(st['input_rel'])} "
                     f"difference to {_fmt(st['output_rel'])}")
    if isinstance(info, dict) and info.get("reaches_target") is False:
        words.append("the first difference beyond tolerance is not reached from it through "
                     "the recorded dataflow")
    if out.get("inner"):
        words.append(f"{e['op']}: {out['inner']['text']}")
    rv = out.get("replay") or {}
    if rv.get("verdict"):
        words.append(f"replay: {rv['verdict']}")
    if out.get("compiled_call"):
        cc = out["compiled_call"]
        words.append(f"compiled-call divergence: every replayed equation of {cc['call']} "
                     f"matches" + (f"; the compiled probe narrows it to {e['op']}"
                                   if cc.get("probe") is not None else ""))
    env = out.get("environment") or {}
    if env.get("causes"):
        c = env["causes"][0]
        words.append(f"most likely cause: {c['key']} ({_short(c['a'])} vs {_short(c['b'])})")
    return ". ".join(words) + "."


def _short(v):
    s = "(unset)" if v is None else str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def short(analysis):
    """(explain dict, chain list) for a `locate` result."""
    if not analysis or not analysis.get("origin"):
        return None, None
    rv = analysis.get("replay") or {}
    o = analysis["origin"]["a"]
    ex = {"verdict": f"{o['op']} (a #{o['index']}): "
                     f"{rv.get('verdict') or analysis.get('summary')}",
          "event": f"{o['op']} (a #{o['index']})",
          "event_index": o["index"], "event_index_b": analysis["origin"]["b"]["index"],
          "replayable": bool(rv.get("replayed")),
          "summary": analysis.get("summary")}
    for side in ("a", "b"):
        s = rv.get(side) or {}
        fo = s.get("from_oracle")
        if fo:
            ex[f"{side}_ulp_from_exact"] = fo["max_ulp"]
    if rv.get("oracle"):
        ex["exact_by"] = rv["oracle"]["computed_by"]
    if rv.get("reproduces"):
        ex["reproduced_here"] = rv["reproduces"]
    if rv.get("mechanism"):   # diff/mechanisms.py: which candidate numerics reproduce each side
        ex["mechanism"] = rv["mechanism"]
    causes = (analysis.get("environment") or {}).get("causes") or []
    if causes:
        ex["likely_cause"] = f"{causes[0]['key']}: {causes[0]['reason']}"
    if analysis.get("compiled_call"):
        ex["compiled_call"] = analysis["compiled_call"]["explanation"]
    return ex, _chain.collapse(analysis.get("chain") or [])


# -- terminal ---------------------------------------------------------------------------------

def print_analysis(an, console=None):
    """The full analysis for a terminal (`tracediff explain`). Rich markup: every string
    from the traces goes through `untrusted.markup` (shown as typed, no escape sequence)."""
    from rich.console import Console

    c = console or Console(highlight=False, soft_wrap=True, emoji=False)
    o = an.get("origin")
    head = "[bold red]DIVERGED[/]" if an.get("verdict") == "diverged" else "[bold green]MATCH[/]"
    c.print(f"{head} (beyond tolerance: {'yes' if an.get('verdict') == 'diverged' else 'no'})")
    if not o:
        c.print(markup(an.get("summary") or "nothing to explain"))
        _print_steps(c, an.get("steps") or [])
        return
    a = o["a"]
    c.print(f"[bold]origin[/]: {markup(a['framework'])} {markup(a['kind'])} [bold]{markup(a['op'])}[/] "
            f"(a #{a['index']}, b #{o['b']['index']}"
            f"{', ' + markup(a['origin']) if a.get('origin') else ''}), step {a['step']}"
            f"{'  ' + markup(a['name_stack']) if a.get('name_stack') else ''}"
            f"{'  ' + markup(a['source']) if a.get('source') else ''}")
    m = o.get("metrics") or {}
    word = {True: "[bold]introduced here[/]", False: "inherited", None: "inputs unknown"}[
        o.get("inputs_match")]
    c.print(f"  {word}: {markup(o.get('inputs_reason') or '')}; outputs differ by max "
            f"{_fmt(m.get('max_ulp'))} ULP (max rel {_fmt(m.get('max_rel'))})")
    if o.get("call"):
        c.print(f"  inside compiled call {markup(o['call']['op'])} (a #{o['call']['a']})")
    if an.get("inner"):
        c.print(f"  inside {markup(a['op'])}: {markup(an['inner']['text'])}")
    if an.get("tolerance_origin"):
        t = an["tolerance_origin"]
        c.print(f"  first beyond tolerance: {markup(t['op'])} (a #{t['index']}, step {t['step']}),"
                f" its inputs within tolerance: {markup(t.get('inputs_reason') or '')}")
    links = an.get("chain") or []
    info = an.get("chain_info") or {}
    if links:
        c.print(f"[bold]chain[/] (dataflow from the origin; {info.get('hops_total', len(links))} "
                f"hops; amplification = output rel / input rel):")
        c.print("  [dim]   a #  step  op                          out rel    in rel     ampl.   "
                "role[/]")
        for lk in _chain.collapse(links):
            if isinstance(lk, str):
                c.print(f"  [dim]{markup(lk)}[/]")
                continue
            e, mm = lk["a"], lk["metrics"]
            c.print(f"  {e['index']:>6}  {e['step']:>4}  {markup(e['op'], limit=26):<26}  "
                    f"{_fmt(mm.get('max_rel')):>9}  {_fmt(lk.get('input_rel')):>9}  "
                    f"{_fmt(lk.get('amplification')):>7}   {markup(lk.get('role') or '')}")
        st = info.get("strongest")
        if st:
            c.print(f"  strongest: {markup(st['op'])} (a #{st['index']}) amplified a "
                    f"{_fmt(st['input_rel'])} difference to {_fmt(st['output_rel'])}")
        if info.get("reaches_target") is False:
            c.print("  the first difference beyond tolerance is not reached through the "
                    "recorded dataflow")
    rv = an.get("replay") or {}
    c.print(f"[bold]replay verdict[/]: {markup(rv.get('verdict') or '-')}")
    if rv.get("replayed"):
        orc = rv.get("oracle") or {}
        mach = rv.get("machine") or {}
        if mach:
            c.print("  this machine: " + ", ".join(
                markup(f"{k} {v if v is not None else '(unset)'}") for k, v in mach.items()))
        if orc:
            c.print(f"  exact reference: {markup(orc['op'])} computed by {markup(orc['computed_by'])} "
                    f"from {markup(orc['from'])}'s recorded inputs")
        for side in ("a", "b"):
            s = rv.get(side) or {}
            fo = s.get("from_oracle")
            rep = {True: "reproduced here bitwise", False: "NOT reproduced here",
                   None: "not replayed"}[s.get("reproduced_here")]
            dist = (f"; from exact: {_ulp_text(fo)}, max rel {_fmt(fo['max_rel'])}"
                    if fo else "")
            c.print(f"  {side}: {markup(s.get('op') or '')} {rep}{dist}"
                    f"{' (' + markup(s['reason']) + ')' if s.get('reason') else ''}")
    if rv.get("mechanism"):   # diff/mechanisms.py
        c.print(f"[bold]mechanism[/]: {markup(rv['mechanism'])}")
    if an.get("compiled_call"):
        cc = an["compiled_call"]
        c.print(f"[bold]compiled-call divergence[/] in {markup(cc['call'])}: "
                f"{markup(cc['explanation'])}" +
                (f". To narrow it: {markup(cc['narrow'])}" if cc.get("probe") is None else ""))
    env = an.get("environment") or {}
    if env.get("causes"):
        c.print(f"[bold]likely causes[/] ({markup(env.get('op_class'))} op; from the recorded environment "
                f"differences, ranked):")
        for i, cause in enumerate(env["causes"][:8], 1):
            c.print(f"  {i}. {markup(cause['key'])}: {markup(_short(cause['a']))} -> "
                    f"{markup(_short(cause['b']))}  ({markup(cause['reason'])})"
                    f"{'  ' + markup(cause['note']) if cause.get('note') else ''}")
    elif env.get("none_found"):
        c.print(f"[bold]likely causes[/]: {markup(env['none_found'])}")
    _print_steps(c, an.get("steps") or [])
    noise = an.get("noise")
    if noise:
        c.print(f"noise floor: {noise['nondeterministic_events']} events nondeterministic on a's "
                f"machine; {noise['skipped_total']} skipped as origin")
    c.print(f"[bold]summary[/]: {markup(an.get('summary') or '')}")


def _print_steps(c, steps):
    if not steps:
        return
    c.print("[bold]divergence over time[/] (per optimizer step):")
    c.print("  [dim]step  params max rel  worst                          loss a            "
            "loss b            loss rel[/]")
    shown = steps if len(steps) <= 30 else steps[:10] + steps[-10:]
    for i, s in enumerate(shown):
        if len(steps) > 30 and i == 10:
            c.print(f"  ... {len(steps) - 20} steps")
        loss = s.get("loss") or {}
        c.print(f"  {s['step']:>4}  {_fmt(s.get('max_rel')):>14}  {markup(s.get('worst') or '-', limit=30):<30} "
                f"{_fmt17(loss.get('a')):>17} {_fmt17(loss.get('b')):>17} "
                f"{_fmt(loss.get('rel')):>9}")


def _fmt17(x):
    return "-" if x is None else f"{x:.12g}"
