"""Compare two recorded values: tolerances per dtype, error metrics, ULP distance.

Rules (the same for every caller):

* Equal hashes mean bitwise equal: callers compare hashes first and only read values
  whose hashes differ.
* NaN equals NaN at the same position; NaN against a number is a mismatch. Infinities
  are equal only with the same sign. Signed zeros compare equal in tolerance terms
  (they are still a bitwise difference).
* An element is within tolerance when |a - b| <= atol + rtol * max(|a|, |b|)
  (symmetric: neither run is the reference).
* ULP distance is counted in the value's own dtype (float16/32/64 through their bits,
  bfloat16 and float8 through their raw bits); integers count one unit per 1.
* Default tolerances per dtype (`DEFAULT_TOLERANCES`), chosen a little above ordinary
  reduction-order noise of that dtype, with atol ~ rtol/10 so that values produced by
  cancellation near zero do not flag on their own:

      float64      rtol 1e-12  atol 1e-14
      float32      rtol 1e-5   atol 1e-6     (complex64 the same)
      float16      rtol 1e-3   atol 1e-4
      bfloat16     rtol 1e-2   atol 1e-3
      float8/6/4   rtol 1e-1   atol 1e-2
      integers, bool, PRNG keys, anything else: exact

  `--rtol/--atol` override the defaults for every floating dtype (a value given for one
  of them keeps the default of the other).
* An output is judged at the tolerance of the least precise floating dtype among its
  own and its inputs' (a float32 value converted to float64 keeps its float32 error).
* `--ulp N`: an element at most N ULP from the other is within tolerance (ULP of the
  value's dtype, or of the less precise input dtype it is judged by: N float32-ULP are
  N * 2**29 float64-ULP). With --ulp alone the rtol/atol rule is not used; with --rtol
  or --atol as well, either rule suffices. Complex values keep the rtol/atol rule.
"""

import math

import numpy as np

# the two levels of difference every finding is judged at
BITWISE, TOLERANCE = "bitwise", "tolerance"

DEFAULT_TOLERANCES = {
    "float64": (1e-12, 1e-14), "complex128": (1e-12, 1e-14),
    "float32": (1e-5, 1e-6), "complex64": (1e-5, 1e-6),
    "float16": (1e-3, 1e-4),
    "bfloat16": (1e-2, 1e-3),
}
LOW_PRECISION = (1e-1, 1e-2)
EXACT = (0.0, 0.0)

_FLOAT_BITS = {"float16": (np.uint16, 16), "bfloat16": (np.uint16, 16), "float32": (np.uint32, 32),
               "float64": (np.uint64, 64)}


def is_floating(dtype_name):
    return dtype_name.startswith(("float", "bfloat", "complex"))


def tolerance(dtype_name, rtol=None, atol=None):
    """(rtol, atol) for a logical dtype name, with user overrides for floating dtypes."""
    if dtype_name in DEFAULT_TOLERANCES:
        r, a = DEFAULT_TOLERANCES[dtype_name]
    elif dtype_name.startswith(("float8", "float6", "float4")):
        r, a = LOW_PRECISION
    else:
        return EXACT if rtol is None and atol is None else (rtol or 0.0, atol or 0.0)
    return (r if rtol is None else rtol, a if atol is None else atol)


def _sign_mag(arr, dtype_name):
    utype, nbits = _FLOAT_BITS[dtype_name]
    bits = np.ascontiguousarray(arr).view(utype).astype(np.uint64)
    sign = np.uint64(1) << np.uint64(nbits - 1)
    mag = (bits & (sign - np.uint64(1))).astype(np.int64)
    return (bits & sign) != 0, mag


def ulp_distance(xa, xb, dtype_name):
    """Elementwise ULP distance as float64 (NaN positions must be masked by the caller).

    Floats are ordered by their sign-magnitude bits: same sign, the distance is the
    difference of magnitudes (exact in int64); opposite signs, the sum (+0 and -0 are
    0 apart)."""
    if dtype_name in _FLOAT_BITS:
        na, ma = _sign_mag(xa, dtype_name)
        nb, mb = _sign_mag(xb, dtype_name)
        same = na == nb
        d = np.where(same, np.abs(ma - mb).astype(np.float64),
                     ma.astype(np.float64) + mb.astype(np.float64))
        return d
    if dtype_name.startswith(("float8", "float6", "float4")) and xa.dtype.itemsize == 1:
        # raw bits of a 1-byte float: sign-magnitude like the others
        ba, bb = (np.ascontiguousarray(x).view(np.uint8).astype(np.int64) for x in (xa, xb))
        oa = np.where(ba & 0x80, -(ba & 0x7F), ba & 0x7F)
        ob = np.where(bb & 0x80, -(bb & 0x7F), bb & 0x7F)
        return np.abs(oa - ob).astype(np.float64)
    return None


def _f64(x):
    a = np.asarray(x)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError):
        return None


def ulp_threshold(n_ulp, dtype_name, tol_dtype=None):
    """`n_ulp` ULP of `tol_dtype` counted in ULP of `dtype_name` (a float32 value
    upcast to float64 may be N float32-ULP off: N * 2**29 float64-ULP)."""
    if not tol_dtype or tol_dtype == dtype_name:
        return float(n_ulp)
    bits = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52,
            "complex64": 23, "complex128": 52}
    own, tol = bits.get(dtype_name), bits.get(tol_dtype)
    if own is None or tol is None or tol >= own:
        return float(n_ulp)
    return float(n_ulp) * 2.0 ** (own - tol)


def compare_arrays(xa, xb, dtype_name, rtol=None, atol=None, tol_dtype=None, ulp=None):
    """Metrics of two arrays of the same logical dtype. Returns a plain dict:

    max_abs, max_rel, max_ulp, mismatch_fraction (elements that differ at all),
    beyond_tolerance_fraction, within_tolerance (bool), rtol, atol, n, worst_index and the
    two values there (worst_a, worst_b).
    Metrics are real floats (`math.inf` for NaN against a number); the JSON edge
    (`report/json_report.py`) writes non-finite ones as the strings "inf"/"nan".
    `tol_dtype` names a less precise dtype whose tolerance applies instead (an output
    computed from lower-precision inputs). `ulp`: an element at most this many ULP (of
    `tol_dtype` when given) from the other is within tolerance; with `ulp` alone the
    rtol/atol rule is not used, with rtol or atol given as well either rule suffices.
    """
    r, a = tolerance(tol_dtype or dtype_name, rtol, atol)
    out = {"rtol": r, "atol": a}
    if tol_dtype and tol_dtype != dtype_name:
        out["tolerance_of"] = tol_dtype
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.shape != xb.shape:
        out.update(shape_mismatch=True, within_tolerance=False, max_abs=None, max_rel=None,
                   max_ulp=None, mismatch_fraction=1.0, beyond_tolerance_fraction=1.0,
                   n=int(max(xa.size, xb.size)))
        return out
    n = int(xa.size)
    out["n"] = n
    fa, fb = _f64(xa), _f64(xb)
    if fa is None or fb is None or n == 0:
        same = xa.tobytes() == xb.tobytes()
        out.update(max_abs=None, max_rel=None, max_ulp=None, within_tolerance=same,
                   mismatch_fraction=0.0 if same else 1.0,
                   beyond_tolerance_fraction=0.0 if same else 1.0)
        return out
    fa, fb = fa.reshape(-1), fb.reshape(-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        nan_a, nan_b = np.isnan(fa), np.isnan(fb)
        both_nan = nan_a & nan_b
        one_nan = nan_a ^ nan_b
        equal = (fa == fb) | both_nan
        diff = np.abs(fa - fb)
        diff[equal] = 0.0
        diff[one_nan] = np.inf
        scale = np.maximum(np.abs(fa), np.abs(fb))
        rel = np.where(diff == 0, 0.0, diff / np.where(scale == 0, 1.0, scale))
        rel[one_nan] = np.inf
        # inf vs inf of the other sign, or inf vs finite: diff is inf (nan for inf-inf)
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = np.where(np.isnan(rel), np.inf, rel)
        beyond = ~equal & ~(np.isfinite(diff) & (diff <= a + r * scale))
    mism = ~equal
    out["mismatch_fraction"] = float(mism.mean()) if n else 0.0
    out["beyond_tolerance_fraction"] = float(beyond.mean()) if n else 0.0
    out["within_tolerance"] = not bool(beyond.any())
    out["max_abs"] = float(diff.max()) if n else 0.0
    out["max_rel"] = float(rel.max()) if n else 0.0
    out["worst_index"] = int(np.argmax(diff)) if mism.any() else None
    if out["worst_index"] is not None:   # the two values there, for the headline
        scalar = complex if fa.dtype.kind == "c" else float
        out["worst_a"] = scalar(fa[out["worst_index"]])
        out["worst_b"] = scalar(fb[out["worst_index"]])
    if xa.dtype.kind in "iub":
        out["max_ulp"] = float(diff.max())
    else:
        u = None
        try:
            u = ulp_distance(xa.reshape(-1), xb.reshape(-1), dtype_name)
        except (TypeError, ValueError):
            u = None
        if u is not None:
            u = np.where(both_nan, 0.0, u)
            u = np.where(one_nan, np.inf, u)
            out["max_ulp"] = float(u.max()) if n else 0.0
        else:
            out["max_ulp"] = None
        if ulp is not None and u is not None and is_floating(dtype_name):
            within_ulp = equal | (u <= ulp_threshold(ulp, dtype_name, tol_dtype))
            ok = within_ulp | ~beyond if (rtol is not None or atol is not None) else within_ulp
            beyond = ~ok
            out["beyond_tolerance_fraction"] = float(beyond.mean()) if n else 0.0
            out["within_tolerance"] = not bool(beyond.any())
            out["ulp"] = ulp
    return out


def worst(metrics_list):
    """Combine metrics of several values of one event: the worst of each."""
    if not metrics_list:
        return None
    if len(metrics_list) == 1:
        return dict(metrics_list[0])

    def key(v):   # None < finite < inf < nan: a NaN difference is the worst of all
        if v is None:
            return (0, 0.0)
        v = float(v)
        if math.isnan(v):
            return (3, 0.0)
        return (2, 0.0) if math.isinf(v) else (1, v)

    out = {}
    for k in ("max_abs", "max_rel", "max_ulp", "mismatch_fraction", "beyond_tolerance_fraction"):
        vals = [m.get(k) for m in metrics_list]
        out[k] = max(vals, key=key)
    out["within_tolerance"] = all(m.get("within_tolerance", False) for m in metrics_list)
    top = max(metrics_list, key=lambda m: key(m.get("max_abs")))
    out.update({k: top[k] for k in ("worst_a", "worst_b") if k in top})
    loosest = max(metrics_list, key=lambda m: m.get("rtol") or 0.0)
    out["rtol"], out["atol"] = loosest.get("rtol"), loosest.get("atol")
    return out


class RelL2:
    """The relative L2 distance ||a - b|| / ||a|| accumulated over several values (all
    parameters of an optimizer step): unlike max rel it is not set by near-zero elements
    (GPT-2 AdamW: "max rel 2" at every step, relative L2 1e-7)."""

    def __init__(self):
        self.diff, self.ref = 0.0, 0.0

    def add(self, xa, xb):
        """Add one pair (b laid out like a); values of other shapes are skipped."""
        xa, xb = np.asarray(xa), np.asarray(xb)
        if xa.shape != xb.shape or xa.dtype.kind not in "fciub" or xb.dtype.kind not in "fciub":
            return
        with np.errstate(all="ignore"):
            a = xa.astype(np.complex128 if xa.dtype.kind == "c" else np.float64)
            b = xb.astype(a.dtype)
            self.diff += float(np.sum(np.abs(a - b) ** 2))
            self.ref += float(np.sum(np.abs(a) ** 2))

    def value(self):
        """None when nothing was added; inf when a is all zero and b is not."""
        if self.diff == 0.0:
            return 0.0
        if self.ref == 0.0:
            return math.inf
        return math.sqrt(self.diff) / math.sqrt(self.ref) if math.isfinite(self.diff) else math.inf
