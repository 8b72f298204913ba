"""Pair the optimizer snapshots of two frameworks by role, not by name.

Why: optax and torch.optim name the same state differently, and the two snapshots are
taken at different moments, so same-name pairing compares nothing (or the wrong things).

* optax (capture/optax_tags.py): `grads/<path>`, `params/<path>` (the params given to
  `update`, i.e. *before* the step), `updates/<path>`, `state/mu|nu|trace/<path>`,
  `state/count`; `<path>` is the pytree path (`params/fc1/kernel` for linen, where the
  first `params` is the collection; `linear1/kernel[/value]` for NNX).
* torch (capture/torch_recorder.py): `params/<name>` (*after* the step), `grads/<name>`,
  `state/<name>/exp_avg|exp_avg_sq|momentum_buffer|step`, `<name>` from
  `named_parameters()` (`fc1.weight`).

Roles: mu <-> exp_avg, nu <-> exp_avg_sq, trace <-> momentum_buffer, count <-> step
(compared by value: int32 1 == float32 1.0), grads <-> grads, and the parameters after
the step: optax `params + updates` <-> torch `params`. Parameters pair by module path and
leaf (kernel/scale/embedding <-> weight, bias <-> bias; kernel values are compared with
the weight's axes permuted), then through the module pairs the dataflow pairing found,
then by order among those of the same size.
"""

import re

STATE_ROLES = {"mu": "exp_avg", "nu": "exp_avg_sq", "trace": "momentum_buffer",
               "momentum": "momentum_buffer", "sum_of_squares": "sum"}
LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "weight": "weight",
        "bias": "bias"}


def _jax_param(path):
    """'params/fc1/kernel' -> ('fc1', 'weight', 'fc1/kernel'): collection and NNX `value`
    dropped, leaf name mapped to torch's."""
    parts = [p for p in path.split("/") if p]
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    if len(parts) > 1 and parts[0] == "params":
        parts = parts[1:]
    if not parts:
        return None
    return "/".join(parts[:-1]), LEAF.get(parts[-1], parts[-1]), "/".join(parts)


def _torch_param(name):
    mod, _, leaf = name.rpartition(".")
    return mod.replace(".", "/"), LEAF.get(leaf, leaf), name


def parse(names, framework):
    """{role: {param key: value name}} of one snapshot. Roles: params, grads, updates,
    state:<torch state key>, count."""
    out = {}
    for name in names:
        parts = name.split("/")
        if framework == "jax":
            if parts[0] == "state" and len(parts) >= 2 and parts[1] == "count":
                out.setdefault("count", {})[""] = name
                continue
            if parts[0] == "state" and len(parts) >= 3:
                role = STATE_ROLES.get(parts[1])
                if role is None:
                    continue
                p = _jax_param("/".join(parts[2:]))
                if p:
                    out.setdefault("state:" + role, {})[p] = name
                continue
            if parts[0] in ("params", "grads", "updates") and len(parts) >= 2:
                p = _jax_param("/".join(parts[1:]))
                if p:
                    out.setdefault(parts[0], {})[p] = name
        else:
            if parts[0] in ("params", "grads") and len(parts) == 2:
                out.setdefault(parts[0], {})[_torch_param(parts[1])] = name
            elif parts[0] == "state" and len(parts) == 3:
                if parts[2] == "step":
                    out.setdefault("count", {})[_torch_param(parts[1])] = name
                else:
                    out.setdefault("state:" + parts[2], {})[_torch_param(parts[1])] = name
    return out


def _norm(module):
    return re.sub(r"[./]+", "/", module).strip("/")


def match_params(keys_a, keys_b, sizes_a, sizes_b, module_map=None):
    """[(key_a, key_b, how)] pairing parameter keys (module, leaf, path) of the two sides.
    `sizes_*`: {key: element count}; `module_map`: {module of a: module of b} from the
    dataflow pairing (name stacks, so with the root module's name on the Flax side)."""
    left_b = list(keys_b)
    out = []

    def take(ka, pred, how):
        for kb in left_b:
            if pred(kb) and sizes_a.get(ka) == sizes_b.get(kb):
                left_b.remove(kb)
                out.append((ka, kb, how))
                return True
        return False

    rest = []
    for ka in keys_a:
        if not take(ka, lambda kb: _norm(kb[0]) == _norm(ka[0]) and kb[1] == ka[1], "by path"):
            rest.append(ka)
    rest2 = []
    for ka in rest:
        mb = None
        for ma, target in (module_map or {}).items():
            ma = _norm(ma)
            if ma == _norm(ka[0]) or ma.endswith("/" + _norm(ka[0])):
                mb = _norm(target)
                break
        if mb is None or not take(ka, lambda kb: _norm(kb[0]) == mb and kb[1] == ka[1],
                                  "by the module pairs of the forward pass"):
            rest2.append(ka)
    for ka in rest2:
        take(ka, lambda kb: kb[1] == ka[1], "by order and size")
    return out


def role_pairs(names_a, fw_a, names_b, fw_b, sizes_a, sizes_b, module_map=None):
    """[(role, name_a or (params, updates), name_b, how)] for one pair of snapshots.
    For the parameters after the step, the optax side is the pair (params, updates)."""
    ra, rb = parse(names_a, fw_a), parse(names_b, fw_b)
    # parameter keys come from params (torch) / params or grads (optax)
    pa = ra.get("params") or ra.get("grads") or {}
    pb = rb.get("params") or rb.get("grads") or {}
    sa = {k: sizes_a.get(v) for k, v in pa.items()}
    sb = {k: sizes_b.get(v) for k, v in pb.items()}
    pairs = match_params(list(pa), list(pb), sa, sb, module_map)
    out = []
    for ka, kb, how in pairs:
        for role in sorted(set(ra) | set(rb)):
            if role in ("count", "updates"):
                continue
            na, nb = ra.get(role, {}).get(ka), rb.get(role, {}).get(kb)
            if role == "params":
                ups = (ra.get("updates") or {}).get(ka) if fw_a == "jax" else None
                upb = (rb.get("updates") or {}).get(kb) if fw_b == "jax" else None
                if fw_a == "jax" and fw_b != "jax":
                    na = (na, ups) if na and ups else None
                elif fw_b == "jax" and fw_a != "jax":
                    nb = (nb, upb) if nb and upb else None
            if na and nb:
                out.append((role, na, nb, how))
    ca, cb = ra.get("count"), rb.get("count")
    if ca and cb:
        out.append(("count", next(iter(ca.values())), next(iter(cb.values())), "by role"))
    return out


def after_step_name(pair_name):
    """The display name of a value name or an optax (params, updates) pair."""
    if isinstance(pair_name, tuple):
        return f"{pair_name[0]} + updates"
    return pair_name
