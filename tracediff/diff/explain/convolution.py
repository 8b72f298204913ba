"""A recorded convolution rewritten as dot products, for the mechanism hypotheses.

Each output element of a convolution is a dot product: the input window under the kernel
(zero where the window reaches into padding or between dilated input elements) against
the kernel's weights for that output feature. `operands` gathers those two vectors at a
sample of output positions, so the matmul hypotheses (bf16-, TF32-, float16-rounded inputs,
float64 accumulation, summation orders) apply to a convolution unchanged.

Both frameworks are brought to one description, `Geometry`: JAX's `conv_general_dilated`
(dimension numbers, padding pairs, window strides, lhs and rhs dilation, feature groups)
and aten's `convolution` / `_convolution` / `conv1d` / `conv2d` / `conv3d` (NC... input,
OI... weight, symmetric padding or "same"/"valid", groups, an optional bias). Not
rewritten (no mechanisms, the replay itself still runs): batch groups, transposed
convolutions, non-float operands.
"""

import dataclasses

import numpy as np

MAX_TERMS = 1 << 23   # sampled positions x window size gathered at most

TORCH_CONVS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d"}
CONV_OPS = TORCH_CONVS | {"conv_general_dilated"}
# aten argument order after (input, weight, bias): where a positional parameter lands
_TORCH_ORDER = {
    "convolution": ("stride", "padding", "dilation", "transposed", "output_padding", "groups"),
    "_convolution": ("stride", "padding", "dilation", "transposed", "output_padding", "groups"),
    "conv1d": ("stride", "padding", "dilation", "groups"),
    "conv2d": ("stride", "padding", "dilation", "groups"),
    "conv3d": ("stride", "padding", "dilation", "groups"),
}


@dataclasses.dataclass
class Geometry:
    """Where each axis is (specs: batch/out-feature axis, feature/in-feature axis, then
    spatial axes, as in `lax.ConvDimensionNumbers`) and how the window moves."""

    lhs_spec: tuple
    rhs_spec: tuple
    out_spec: tuple
    strides: tuple
    padding: tuple          # (low, high) per spatial axis, low may be negative
    lhs_dilation: tuple
    rhs_dilation: tuple
    groups: int


def _ints(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ValueError(f"expected {n} ints, got {v!r}")
    return tuple(v)


def jax_geometry(params, ndim):
    if int(params.get("batch_group_count", 1)) != 1:
        return None
    dims = params.get("dimension_numbers")
    specs = dims[1] if isinstance(dims, tuple) and len(dims) == 2 and dims[0] == "conv_dims" \
        else dims
    if not (isinstance(specs, tuple) and len(specs) == 3):
        return None
    lhs, rhs, out = (tuple(int(d) for d in s) for s in specs)
    n = ndim - 2
    pads = tuple(tuple(int(x) for x in p) for p in params.get("padding", ((0, 0),) * n))
    return Geometry(lhs, rhs, out, _ints(params.get("window_strides", 1), n), pads,
                    _ints(params.get("lhs_dilation", 1), n), _ints(params.get("rhs_dilation", 1), n),
                    int(params.get("feature_group_count", 1)))


def torch_geometry(name, params, ndim, kernel_shape):
    p = dict(params)
    for i, key in enumerate(_TORCH_ORDER.get(name, ())):
        if f"_pos{i + 3}" in p:
            p.setdefault(key, p[f"_pos{i + 3}"])
    if p.get("transposed"):
        return None
    n = ndim - 2
    strides, dilation = _ints(p.get("stride", 1), n), _ints(p.get("dilation", 1), n)
    pad = p.get("padding", 0)
    if pad == "valid":
        pads = ((0, 0),) * n
    elif pad == "same":
        total = [d * (k - 1) for d, k in zip(dilation, kernel_shape[2:])]
        pads = tuple((t // 2, t - t // 2) for t in total)
    else:
        pads = tuple((x, x) for x in _ints(pad, n))
    ident = tuple(range(ndim))
    return Geometry(ident, ident, ident, strides, pads, (1,) * n, dilation,
                    int(p.get("groups", 1)))


def operands(geo, lhs, rhs, out_shape, positions):
    """(a, b): the input windows and kernel columns at flat output `positions` (in the
    output's own layout), each (len(positions), window size); None when the shapes do not
    fit the geometry or the gather would exceed MAX_TERMS."""
    L = np.transpose(lhs, geo.lhs_spec)        # (N, C, spatial...)
    R = np.transpose(rhs, geo.rhs_spec)        # (O, I, kernel...)
    n, c = L.shape[:2]
    o, i = R.shape[:2]
    d = L.ndim - 2
    out_c = tuple(out_shape[a] for a in geo.out_spec)   # (N, O, out spatial...)
    g = geo.groups
    if R.ndim != L.ndim or g < 1 or c != i * g or o % g or out_c[:2] != (n, o) or \
            len(geo.padding) != d:
        return None
    kernel = R.shape[2:]
    window = i * int(np.prod(kernel, dtype=np.int64))
    if window == 0 or len(positions) * window > MAX_TERMS:
        return None
    coords = np.unravel_index(positions, out_shape)
    batch, feat = coords[geo.out_spec[0]], coords[geo.out_spec[1]]
    spatial = [coords[a] for a in geo.out_spec[2:]]
    offsets = np.stack(np.unravel_index(np.arange(int(np.prod(kernel))), kernel), axis=1)
    valid = np.ones((len(positions), len(offsets)), bool)
    src = []
    for j in range(d):
        q = spatial[j][:, None] * geo.strides[j] + offsets[None, :, j] * geo.rhs_dilation[j] \
            - geo.padding[j][0]
        ld = geo.lhs_dilation[j]
        ok = (q >= 0) & (q <= (L.shape[2 + j] - 1) * ld) & (q % ld == 0)
        valid &= ok
        src.append(np.where(ok, q // ld, 0))
    group = feat // (o // g)
    chans = group[:, None] * i + np.arange(i)[None, :]            # (P, I)
    idx = (batch[:, None, None], chans[:, :, None]) + tuple(s[:, None, :] for s in src)
    a = L[idx]                                                      # (P, I, K)
    a = np.where(valid[:, None, :], a, np.zeros((), a.dtype))
    b = R[feat].reshape(len(positions), i, -1)                      # (P, I, K)
    return a.reshape(len(positions), window), b.reshape(len(positions), window)
