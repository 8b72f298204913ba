"""Session-wide recordings shared by several test modules (each is recorded once)."""

import os

import pytest

from .helpers import ROOT, record_many

PERTURB = os.path.join(ROOT, "tests", "perturb")
GRU_STEPS = "3"


@pytest.fixture(scope="session")
def jax_gru(tmp_path_factory):
    """The GRU+expm+Adam example recorded four ways: twice plainly, with XLA limited to
    SSE4.2 code generation, and with `tanh` made one ULP larger."""
    folder = tmp_path_factory.mktemp("jax_gru")
    args = ("--steps", GRU_STEPS)
    jobs = {
        "a": ("jax_gru_expm_adam.py", folder / "a.h5", args, None),
        "a2": ("jax_gru_expm_adam.py", folder / "a2.h5", args, None),
        "isa": ("jax_gru_expm_adam.py", folder / "isa.h5", args,
                {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}),
        "tanh": ("jax_gru_expm_adam.py", folder / "tanh.h5", args,
                 {"PYTHONPATH": os.path.join(PERTURB, "tanh_ulp")}),
    }
    procs = record_many(jobs)
    return {key: (job[1], procs[key]) for key, job in jobs.items()}
