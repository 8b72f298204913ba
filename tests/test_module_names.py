"""Flax name stacks and torch module paths map themselves (issue #26, item 3): the usual
conventions need no --map (`layer/0` = `layer.0`, `layers_0` = `layers.0`, the root
module's name, `kernel` = `weight`ᵀ, `scale`/`embedding` = `weight`), the output shows the
rules it used, and says when values pair across different names (a port that swapped
query and key: fixtures/port_transformer.py --swap-qk, where the truth is the swap itself:
torch's `query` Linear holds Flax's `key` kernel)."""

import json

import pytest

import tracediff
from tracediff.diff.align import modnames
from tracediff.diff.align import optroles

from .helpers import run_cli


def test_conventions():
    assert modnames.match("FlaxBertModule/encoder/layer/0/attention/self/query",
                          "encoder.layer.0.attention.self.query") == \
        (True, ["root FlaxBertModule dropped"])
    assert modnames.match("MLP/layers_0", "layers.0") == \
        (True, ["root MLP dropped", "layers_0 = layers.0"])
    assert modnames.match("encoder/layer/0/output/dense/kernel",
                          "encoder.layer.0.output.dense.weight", leaf=True) == \
        (True, ["kernel = weight\u1d40"])
    assert modnames.match("LayerNorm/scale", "LayerNorm.weight", leaf=True)[0]
    assert modnames.match("embed/embedding", "embed.weight", leaf=True)[0]
    # an einsum's spec in a Flax name stack is not a module
    assert modnames.match("M/attn/...qhd,...khd->...hqk", "attn")[0]
    # different modules never match; a submodule computing its parent's value never crosses
    assert modnames.match("M/layers_0", "layers.1") == (False, [])
    assert modnames.match("block/fc1", "fc1") == (False, [])    # a submodule is no root
    assert modnames.crossing("M/block/attn/query", "block.attn.key") == \
        "values of query pair with key's"
    assert modnames.crossing("M/encoder/layer/0/attention/self", "encoder.layer.1.attention.self") \
        == "values of layer/0 pair with layer.1's"
    assert modnames.crossing("M/encoder/layer/0/intermediate",
                             "encoder.layer.0.intermediate.intermediate_act_fn") is None


def test_optimizer_parameters_pair_by_name_not_by_order():
    """`layers_0` against `layers.0`: before the rule, parameters of equal size paired by
    order, layers_0's kernel with whichever `weight` came first (layers.1's here)."""
    keys_a = [optroles._jax_param(p) for p in ("params/layers_0/kernel", "params/layers_1/kernel")]
    keys_b = [optroles._torch_param(p) for p in ("layers.1.weight", "layers.0.weight")]
    pairs = optroles.match_params(keys_a, keys_b, {k: 16 for k in keys_a}, {k: 16 for k in keys_b})
    got = {a[2]: (b[2], how) for a, b, how in pairs}
    assert got == {"layers_0/kernel": ("layers.0.weight", "by name (layers_0 = layers.0)"),
                   "layers_1/kernel": ("layers.1.weight", "by name (layers_1 = layers.1)")}


@pytest.fixture(scope="module")
def swapped(recorded):
    return recorded("port_transformer.py", "--swap-qk")


def test_swapped_query_and_key_are_named(swapped):
    r = tracediff.locate(str(swapped))
    linear = [m for m in r.mapping if m["family"] == "linear"]
    crossed = {(m["a_module"], m["b_module"]): m["names_cross"] for m in linear if m["names_cross"]}
    # exactly the swap, from the values: Flax's key projection computes what torch's query does
    assert crossed == {("Model/block/attn/key", "block/attn/query"): "values of key pair with query's",
                       ("Model/block/attn/query", "block/attn/key"): "values of query pair with key's"}
    # every other layer pairs under the naming rules, no --map given
    rest = [m for m in linear if not m["names_cross"]]
    assert {m["a_module"] for m in rest} >= {"Model/block/attn/value", "Model/block/attn/out",
                                             "Model/block/fc1", "Model/block/fc2", "Model/head"}
    assert all(m["module_rule"] == "root Model dropped" for m in rest)
    # the first finding (the attention scores, computed from the swapped projections) says so
    f = r.first_beyond_tolerance
    assert f is not None and f.layer["a_module"] == "Model/block/attn", f.layer
    assert "upstream values pair across names: values of" in f.note, f.note
    proc = run_cli("locate", swapped, env={"NO_COLOR": "1", "COLUMNS": "250"})
    assert proc.returncode in (0, 1), proc.stderr
    assert "modules paired by name:" in proc.stdout and "root Model dropped" in proc.stdout
    assert "names cross: values of query pair with key's  (a Model/block/attn/query <-> " \
           "b block.attn.key)" in proc.stdout
    d = json.loads(run_cli("locate", swapped, "--json").stdout)
    assert any(m.get("names_cross") == "values of key pair with query's" for m in d["mapping"])
