"""Across JAX versions: the same fixture recorded under the oldest supported JAX (0.7.2)
and this one (conftest.two_jax_versions: a bundled trace, or a fresh recording when CI names
the other JAX's Python in TRACEDIFF_OTHER_JAX_PYTHON)."""

import json

import pytest

import tracediff

from .helpers import run_cli


@pytest.fixture(scope="module")
def two_versions(two_jax_versions):
    return two_jax_versions


def test_traces_of_two_versions_share_one_schema(two_versions):
    old, new = (tracediff.load(p) for p in two_versions)
    assert old.schema_version == new.schema_version
    v_old, v_new = old.manifest["packages"]["jax"], new.manifest["packages"]["jax"]
    assert v_old != v_new
    # version-specific primitive names are normalised: nested jits are `jit:<function>` in both
    for t in (old, new):
        ops = {t.string(i) for i in t.events["op"]}
        assert "pjit" not in ops and any(op.startswith("jit:") for op in ops)


def test_locate_names_the_version_difference_and_the_first_differing_op(two_versions):
    old, new = two_versions
    proc = run_cli("locate", old, new, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    env = report["env_diff"]
    assert env[0]["key"] in ("packages.jax", "packages.jaxlib"), env[:3]
    first = report["first_difference"]
    assert first is not None, "different JAX versions gave bitwise identical traces"
    assert first["a"]["op"] == first["b"]["op"]
    al = report["alignment"]
    assert al["matched"] > 0.9 * min(al["events_a"], al["events_b"])
    text = run_cli("locate", old, new).stdout
    assert "packages.jax" in text
