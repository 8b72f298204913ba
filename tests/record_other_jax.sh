#!/usr/bin/env bash
# Re-record the bundled traces of the oldest supported JAX (tests/conftest.OLD_JAX_TRACE,
# tests/test_mechanisms.OLD_JAX_DIVIDE), needed when the trace schema changes.
# Usage: tests/record_other_jax.sh PYTHON_WITH_JAX_0.7.2
#
# The traces ship with the repository, so they are recorded from a copy of it in a fresh
# temporary folder: the script path, source lines and PYTHONPATH they carry name no
# developer's checkout. They also carry PYTHON's own path: use an environment outside your
# home folder (say /opt/jax-0.7.2).
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
COPY="$(mktemp -d /tmp/tracediff.XXXXXX)"
trap 'rm -rf "$COPY"' EXIT
cp -r "$SRC/tracediff" "$SRC/fixtures" "$COPY/"
cd "$COPY"
PYTHONPATH="$COPY" "$1" -m tracediff record -o "$SRC/fixtures/traces/jax_gru_expm_adam.jax-0.7.2.h5" \
    fixtures/jax_gru_expm_adam.py --steps 1
PYTHONPATH="$COPY" "$1" -m tracediff record -o "$SRC/fixtures/traces/jax_divide.jax-0.7.2.h5" \
    fixtures/jax_divide.py
