#!/usr/bin/env bash
# Re-record the bundled traces of the oldest supported JAX (tests/conftest.OLD_JAX_TRACE,
# tests/test_mechanisms.OLD_JAX_DIVIDE), needed when the trace schema changes.
# Usage: tests/record_other_jax.sh PYTHON_WITH_JAX_0.7.2
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD" "$1" -m tracediff record -o fixtures/traces/jax_gru_expm_adam.jax-0.7.2.h5 \
    fixtures/jax_gru_expm_adam.py --steps 1
PYTHONPATH="$PWD" "$1" -m tracediff record -o fixtures/traces/jax_divide.jax-0.7.2.h5 \
    fixtures/jax_divide.py
