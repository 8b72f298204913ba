"""Module paths and parameter names of two frameworks, mapped by the usual conventions.

Why: a Flax model and its torch port name the same layer differently: the Flax name stack
starts with the root module (`FlaxBertModule/encoder/layer/0`) where torch's path is
relative to the model (`encoder.layer.0`), Flax writes list members `layers_0` where torch
writes `layers.0`, and the leaves are `kernel` (the weight transposed), `scale` and
`embedding` where torch says `weight`. Without these rules every pair would look like a
renaming, and a real one (a port that swapped query and key) would hide among them.

`canonical` turns a path of either framework into components; `match` says whether two
paths name the same module and by which rules, so that reports show the mapping used
and say when values pair across different names.
"""

import re

_INDEXED = re.compile(r"^(.*[A-Za-z])_(\d+)$")           # layers_0 -> layers, 0
_TRANSFORM = re.compile(r"[A-Za-z_][\w]*\(")               # jvp(, transpose(, vmap(
# parameter leaves: Flax name -> torch name, and what the value is on the torch side
LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "weight": "weight",
        "bias": "bias"}
LEAF_RULE = {"kernel": "kernel = weight\u1d40", "scale": "scale = weight",
             "embedding": "embedding = weight"}


def components(path):
    """'FlaxBertModule/encoder/layer/0' or 'encoder.layer.0' or 'transpose(jvp(M))/fc1'
    -> their components, JAX transforms dropped (no index splitting)."""
    s = _TRANSFORM.sub("", path or "").replace(")", "")
    # an einsum's spec in a Flax name stack ('.../self/...qhd,...khd->...hqk') is no module
    parts = [p for p in s.split("/") if p and not re.search(r"->|,|\.\.\.", p)]
    return [c for p in parts for c in p.split(".") if c]


def canonical(path, leaf=False):
    """Components of a module path (or, with `leaf`, a parameter path) comparable across
    frameworks: `name_N` split into `name`, `N`; a parameter leaf named as torch does."""
    parts = components(path)
    out = []
    for i, c in enumerate(parts):
        if leaf and i == len(parts) - 1:
            out.append(LEAF.get(c, c))
            continue
        m = _INDEXED.match(c)
        out.extend((m.group(1), m.group(2)) if m else (c,))
    return out


def match(path_a, path_b, leaf=False):
    """(True, [rules used]) when the two paths name the same module (parameter, with
    `leaf`) by the usual conventions, else (False, []). Rules: the root module's name on
    one side dropped ('root FlaxBertModule dropped'), 'layers_0 = layers.0',
    'kernel = weight\u1d40'."""
    ca, cb = canonical(path_a, leaf), canonical(path_b, leaf)
    rules = []
    if ca != cb:
        # a root module is named by its class (`FlaxBertModule`, `MLP`), a submodule by
        # its attribute (`block`): only the former is dropped
        if len(ca) == len(cb) + 1 and ca[1:] == cb and ca[0][:1].isupper():
            rules.append(f"root {components(path_a)[0]} dropped")
        elif len(cb) == len(ca) + 1 and cb[1:] == ca and cb[0][:1].isupper():
            rules.append(f"root {components(path_b)[0]} dropped")
        else:
            return False, []
    for p in (components(path_a), components(path_b)):
        for c in p[:-1] if leaf else p:
            m = _INDEXED.match(c)
            if m:
                rules.append(f"{c} = {m.group(1)}.{m.group(2)}")
    if leaf:
        la, lb = components(path_a)[-1:], components(path_b)[-1:]
        for x in la + lb:
            if x in LEAF_RULE and (la != lb):
                rules.append(LEAF_RULE[x])
    return True, list(dict.fromkeys(rules))


def crossing(path_a, path_b):
    """When two modules whose values pair have different names: 'values of query pair
    with key's' (the last components that differ, root dropped), else None."""
    if not path_a or not path_b or match(path_a, path_b)[0]:
        return None
    ca, cb = canonical(path_a), canonical(path_b)
    for xa, xb in ((ca, cb), (ca[1:], cb), (ca, cb[1:])):
        n = min(len(xa), len(xb))
        if n and xa[:n] == xb[:n]:
            return None   # one inside the other: a submodule computes it on one side
    # align from the end (Flax carries the root's name in front)
    i = 0
    while i < min(len(ca), len(cb)) and ca[-1 - i] == cb[-1 - i]:
        i += 1
    ra, rb = ca[:len(ca) - i], cb[:len(cb) - i]
    if len(ra) == len(rb) + 1:
        ra = ra[1:]
    j = 0
    while j < min(len(ra), len(rb)) and ra[j] == rb[j]:
        j += 1
    if j and ((ra[j:] or [""])[0].isdigit() or (rb[j:] or [""])[0].isdigit()):
        j -= 1   # 'layer/0' against 'layer.1', not '0' against '1'
    da, db = "/".join(ra[j:]) or path_a, ".".join(rb[j:]) or path_b
    return f"values of {da} pair with {db}'s"
