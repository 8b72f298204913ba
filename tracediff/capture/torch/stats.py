"""Value statistics with torch's own ops, on the device that holds the values.

The stats level stores, per value, min and max over the non-NaN elements, mean and L2
norm over the finite ones, and the NaN and Inf counts (`trace.values.STAT_FIELDS`). The
numpy version (`values.segment_stats`) needs the bytes on the host; this one takes a
tensor on any device (CPU here, CUDA the same code) and returns one small (n, 6) float64
tensor per batch, so a GPU recording moves six numbers per value to the host, in one
transfer per batch, instead of every byte. Same definitions as the numpy version (the
tests compare the two on the same recorded values):

- many small values back to back (host batches: numpy's `reduceat`, faster on CPU;
  device batches: `tensor_segment_stats`): float64 sums;
- one large float32/float64 value: a sum and a dot in its own dtype (pairwise/blocked,
  relative error near eps*log2(n); `diff/compare/levels.py` allows for that), min and max from
  one `aminmax` pass: three passes over memory instead of numpy's four;
- NaN/Inf anywhere: the masked definitions (min/max ignore NaN, mean/L2 finite only).
"""

import numpy as np

from ...trace import norms, values

_torch = None


def _t():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


def segment_stats(flat, starts, counts, logical):
    """`values.segment_stats` for host numpy batches, computed by torch (drop-in
    `TraceWriter.stats_reducer`); dtypes torch cannot view fall back to numpy."""
    torch = _t()
    kind = flat.dtype.kind
    if logical.startswith("key<") or logical in values._ML_DTYPES or kind not in "fciub" or \
            flat.dtype == np.uint16 or flat.dtype == np.uint32 or flat.dtype == np.uint64 or \
            len(counts) > 1 or flat.nbytes < values.WHOLE_VALUE_BYTES:
        # a batch of host values: numpy's reduceat is ~4x faster than torch's
        # segment_reduce on CPU (17 vs 74 ms for 3,400 values, 3.1M float32 here), and the
        # batch is already on the host; a small value alone takes the batch's arithmetic
        # (values.WHOLE_VALUE_BYTES); one large value keeps torch's single `aminmax`
        return values.segment_stats(flat, starts, counts, logical)
    per = 1
    if kind == "c":
        flat, per = flat.view(flat.real.dtype), 2
    # tracediff's own ops: never seen by the recording's dispatch mode (a flush can run
    # while the mode is active, e.g. from a hook), never tracked by autograd
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        x = torch.from_numpy(flat) if flat.size else torch.zeros(0, dtype=torch.float64)
        return tensor_segment_stats(x, starts, counts, per=per).numpy()


def tensor_segment_stats(x, starts, counts, per=1):
    """Statistics of values stored back to back in the 1-D tensor `x` (any device):
    value i is `counts[i]` elements from `starts[i]` (`per` numbers per element: 2 for
    complex viewed as reals). Returns an (n, 6) float64 tensor on x's device."""
    torch = _t()
    dev = x.device
    n = len(counts)
    out = torch.full((n, 6), float("nan"), dtype=torch.float64, device=dev)
    out[:, 4:] = 0
    if not n:
        return out
    counts = torch.as_tensor(np.asarray(counts, np.int64) * per, device=dev)
    if not x.is_floating_point():
        x = x.to(torch.float64)
    nz = counts > 0
    total = int(counts.sum())
    if total == 0:
        return out
    x = x[:total] if x.numel() != total else x
    one = n == 1
    if one and x.dtype in (torch.float32, torch.float64):
        tot = x.sum(dtype=x.dtype).to(torch.float64).reshape(1)
    else:
        xd = x.to(torch.float64)
        tot = torch.segment_reduce(xd, "sum", lengths=counts, unsafe=True)
    res = torch.empty((n, 6), dtype=torch.float64, device=dev)
    if bool(torch.isfinite(tot[nz]).all()):
        if one:
            mn, mx = torch.aminmax(x)
            res[:, 0], res[:, 1] = mn.to(torch.float64), mx.to(torch.float64)
        else:
            res[:, 0] = torch.segment_reduce(x, "min", lengths=counts, unsafe=True).to(torch.float64)
            res[:, 1] = torch.segment_reduce(x, "max", lengths=counts, unsafe=True).to(torch.float64)
        res[:, 2] = tot / counts.clamp(min=1)
        if one and x.dtype in (torch.float32, torch.float64):
            sq = torch.dot(x, x).to(torch.float64).reshape(1)
            summed = x.dtype            # the sums ran in the value's dtype
        else:
            xd = x.to(torch.float64)
            sq = torch.segment_reduce(xd * xd, "sum", lengths=counts, unsafe=True)
            summed = torch.float64
        res[:, 3] = sq.sqrt()
        res[:, 4:] = 0
        if summed != torch.float64 or x.dtype == torch.float64:
            _scale_where_needed(res, x, counts, counts, torch.maximum(-res[:, 0], res[:, 1]),
                                summed)
    else:
        xd = x.to(torch.float64)
        nan = torch.isnan(xd)
        fin = torch.isfinite(xd)
        seg = torch.repeat_interleave(torch.arange(n, device=dev), counts)
        cnt_nan = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(0, seg, nan.double())
        cnt_fin = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(0, seg, fin.double())
        inf = float("inf")
        mn = torch.full((n,), inf, dtype=torch.float64, device=dev).scatter_reduce_(
            0, seg, torch.where(nan, inf, xd), "amin")
        mx = torch.full((n,), -inf, dtype=torch.float64, device=dev).scatter_reduce_(
            0, seg, torch.where(nan, -inf, xd), "amax")
        all_nan = cnt_nan == counts
        mn[all_nan] = float("nan")
        mx[all_nan] = float("nan")
        xf = torch.where(fin, xd, 0.0)
        tot = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(0, seg, xf)
        sq = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(0, seg, xf * xf)
        res[:, 0], res[:, 1] = mn, mx
        res[:, 2] = torch.where(cnt_fin > 0, tot / cnt_fin.clamp(min=1), float("nan"))
        res[:, 3] = sq.sqrt()
        if x.dtype == torch.float64:   # float64 squares (and sums) may leave float64
            amax = torch.zeros(n, dtype=torch.float64, device=dev).scatter_reduce_(
                0, seg, xf.abs(), "amax")
            _scale_where_needed(res, xf, counts, cnt_fin, amax, torch.float64)
        res[:, 4] = cnt_nan
        res[:, 5] = counts - cnt_fin - cnt_nan
    out[nz] = res[nz]
    return out


def _scale_where_needed(res, x, counts, finite, amax, summed):
    """`norms.scale_where_needed` in torch ops: res[i, 2:4] (mean, L2) of each value i
    (back to back in x, zeros in place of non-finite numbers; `finite`: its count of
    finite numbers) whose largest finite magnitude `amax` is beyond `norms.plain` for
    sums in `summed`, again in its dtype on its numbers scaled by 2^-k (`norms.mean_l2`;
    issue 66: a float32 dot of squares below ~1e-19 is 0)."""
    torch = _t()
    amax_h = amax.double().cpu().numpy()
    counts_h = counts.cpu().numpy()
    bad = np.flatnonzero(~norms.plain(np.dtype(str(summed).split(".")[-1]), counts_h, amax_h))
    if not bad.size:
        return
    starts = np.cumsum(counts_h) - counts_h
    finite_h = finite.cpu().numpy()
    for i in bad.tolist():
        s, c = int(starts[i]), int(counts_h[i])
        if not amax_h[i] > 0 or not finite_h[i]:
            continue
        k = norms.exponent(amax_h[i])
        y = x[s:s + c]
        y = y if y.is_floating_point() else y.to(torch.float64)
        half = -k // 2      # two factors of 2^-k, each within float32's range
        y = y * 2.0 ** half * 2.0 ** (-k - half)
        mean, l2 = norms.unscaled(float(y.sum(dtype=y.dtype)), float(torch.dot(y, y)),
                                  float(finite_h[i]), k)
        res[i, 2], res[i, 3] = mean, l2
