"""Test perturbation: make the CPU kernel of aten::addmm multiply in TF32-like precision.

Both matrix operands are truncated to a 10-bit mantissa before the product (what
TensorFloat-32 matmuls on Ampere GPUs do), the bias is added in float32. Put this folder
on PYTHONPATH of a subprocess; torch is imported and patched at start-up.
"""
import warnings

import torch

warnings.filterwarnings("ignore", message="Warning only once for all operators")

_lib = torch.library.Library("aten", "IMPL")


def _tf32(t):
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    return (bits & ~0x1FFF).view(torch.float32)


def _addmm_tf32(self, mat1, mat2, *, beta=1, alpha=1):
    prod = torch.mm(_tf32(mat1), _tf32(mat2))
    return self * beta + prod * alpha


_lib.impl("addmm", _addmm_tf32, "CPU")
