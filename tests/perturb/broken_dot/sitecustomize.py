"""Test perturbation: make the CPU kernel of aten::dot return zero, like the broken build.

Put this folder on PYTHONPATH of a subprocess; Python imports it at start-up, so torch is
already imported (and broken) before tracediff installs its capture.
"""
import warnings

import torch

warnings.filterwarnings("ignore", message="Warning only once for all operators")

_lib = torch.library.Library("aten", "IMPL")


def _zero_dot(a, b):
    return torch.zeros((), dtype=a.dtype, device=a.device)


_lib.impl("dot", _zero_dot, "CPU")
