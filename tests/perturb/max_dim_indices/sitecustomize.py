"""Test perturbation: aten::max.dim returns the right values but the wrong indices (each
row's argmax moved one column on), a fault in the second output of a two-output op.

Put this folder on PYTHONPATH of a subprocess; Python imports it at start-up.
"""
import warnings

import torch

warnings.filterwarnings("ignore", message="Warning only once for all operators")

_lib = torch.library.Library("aten", "IMPL")


def _max_dim(x, dim, keepdim=False):
    values = torch.amax(x, dim, keepdim)
    indices = (torch.argmax(x, dim, keepdim) + 1) % x.shape[dim]
    return values, indices


_lib.impl("max.dim", _max_dim, "CPU")
