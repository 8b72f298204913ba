"""Pair the optimizer snapshots of two frameworks by role, not by name.

Why: optax and torch.optim name the same state differently, and the two snapshots are
taken at different moments, so same-name pairing compares nothing (or the wrong things).

* optax (capture/jax/optax_tags.py): `grads/<path>`, `params/<path>` (the params given to
  `update`, i.e. *before* the step), `updates/<path>`, `state/mu|nu|trace/<path>`,
  `state/count`; `<path>` is the pytree path (`params/fc1/kernel` for linen, where the
  first `params` is the collection; `linear1/kernel[/value]` for NNX).
* torch (capture/torch/optimizer.py): `params/<name>` (*after* the step), `grads/<name>`,
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

import numpy as np

from . import modnames

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


WRAPPED_STATE = ("inner_state", "inner_opt_state")   # inject_hyperparams, masked, MultiSteps


def _unwrapped(parts):
    """An optax state path without the wrappers' levels: `state/inner_state/mu/...` (under
    `inject_hyperparams` or `masked`) is `state/mu/...`."""
    if parts and parts[0] == "state":
        i = 1
        while i < len(parts) - 1 and parts[i] in WRAPPED_STATE:
            i += 1
        return [parts[0]] + parts[i:]
    return parts


def parse(names, framework):
    """{role: {param key: value name}} of one snapshot. Roles: params, grads, updates,
    state:<torch state key>, count."""
    out = {}
    for name in names:
        parts = name.split("/")
        if framework == "jax":
            parts = _unwrapped(parts)
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
    # the usual conventions (align/modnames.py): `layers_0` = `layers.0`, a root module's name
    rest, named = [], rest
    for ka in named:
        ok = False
        for kb in list(left_b):
            hit, rules = modnames.match(ka[0], kb[0])
            if hit and kb[1] == ka[1] and take(ka, lambda x, kb=kb: x is kb,
                                               f"by name ({'; '.join(rules)})"):
                ok = True
                break
        if not ok:
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


# -- optimizer-internal ops: which leaf and which state they compute --------------------------

def _role_text(name):
    """'state/mu/Dense_0/kernel' -> 'mu of Dense_0/kernel'; 'state/fc1.weight/exp_avg' ->
    'exp_avg of fc1.weight'; 'params/fc1.weight' -> 'fc1.weight after the step';
    'updates/Dense_0/kernel' -> 'update of Dense_0/kernel'."""
    parts = name.split("/")
    head, rest = parts[0], parts[1:]
    if head == "state" and rest:
        if rest[0] in STATE_ROLES or rest[0] in ("count",):
            return f"{rest[0]} of {'/'.join(rest[1:])}" if len(rest) > 1 else rest[0]
        return f"{rest[-1]} of {'/'.join(rest[:-1])}" if len(rest) > 1 else rest[0]
    if head == "params" and rest:
        return f"{'/'.join(rest)} after the step"
    if head == "updates" and rest:
        return f"update of {'/'.join(rest)}"
    return name


def op_label(t, ev, snapshot_cache=None):
    """What an optimizer-internal op of trace `t` computes, read from its step's optimizer
    snapshot, e.g. 'torch Adam: exp_avg of fc1.weight', 'optax: mu of Dense_0/kernel':
    the snapshot value its output equals (same content hash: the op wrote that state); for
    a torch optimizer op that wrote none, the first one its output flows into ('torch
    Adam: in the computation of exp_avg_sq of fc1.weight'). None when no snapshot value
    comes from it."""
    from ...trace import schema

    ev = int(ev)
    events = t.events
    if not 0 <= ev < len(events):
        return None
    kind = int(events["kind"][ev])
    phase = int(events["phase"][ev])
    if kind == schema.KIND_OPTIM:
        return None
    step = int(events["step"][ev])
    cache = snapshot_cache if snapshot_cache is not None else {}
    key = ("snap", step)
    if key not in cache:
        cand = np.flatnonzero((events["kind"] == schema.KIND_OPTIM) & (events["step"] == step))
        snap = int(cand[0]) if len(cand) else -1
        names = {}
        if snap >= 0:
            for r in t.value_rows(snap, schema.ROLE_OUT):
                names.setdefault(int(r["hash"]), []).append(t.string(r["name"]))
        who = t.string(events["op"][snap]).split(":", 1)[-1] if snap >= 0 else ""
        fw = int(events["framework"][snap]) if snap >= 0 else -1
        who = f"torch {who}" if fw == schema.FW_TORCH else (who or "optimizer")
        # JAX: the update starts where optax_tags names its first leaf (a `name` equation);
        # nothing before it is the optimizer's (equal bytes there are a coincidence)
        start = 0
        if fw == schema.FW_JAX and snap >= 0:
            name_ids = [i for i, x in enumerate(t.strings) if x == "name"]
            tags = np.flatnonzero(np.isin(events["op"], name_ids) & (events["step"] == step))
            start = int(tags[0]) if len(tags) else snap
        cache[key] = (snap, names, who, start)
    snap, names, who, start = cache[key]
    if snap < 0 or ev > snap or ev < start:
        return None
    torch = int(events["framework"][ev]) == schema.FW_TORCH

    vals = t.values

    def wrote(e):
        """(snapshot names e's outputs equal (same bytes, dtype and shape), whether a later
        op before the snapshot has the same bytes: then e is a step toward them)."""
        found, later = [], False
        for r in t.value_rows(e, schema.ROLE_OUT):
            h = int(r["hash"])
            for n in names.get(h, ()):
                # JAX: params in the snapshot are the ones given to update (before the
                # step, equal to the forward's inputs): only state and updates are written
                if not torch and not n.startswith(("state/", "updates/")):
                    continue
                found.append(n)
            if h in names:
                same = vals["event"][(vals["hash"] == r["hash"]) & (vals["role"] == schema.ROLE_OUT)]
                same = same[(same > e) & (same < snap)]
                # a later op with the same bytes: e is a step toward the state (not an
                # identity that only names it: optax_tags' `name` equations)
                later |= any(t.string(events["op"][x]) != "name" for x in same.tolist())
        return found, later

    def text(found, later):
        roles = sorted({_role_text(n) for n in found})
        if len(roles) > 1:   # equal values of several leaves (zeros, step counts)
            kinds = {(n.split("/")[-1] if torch else n.split("/")[1]) if n.startswith("state/")
                     else n.split("/")[0] for n in found}
            if len(kinds) != 1:
                return None
            return f"{who}: {'in the computation of ' if later else ''}{kinds.pop()} " \
                   f"(equal for {len(roles)} leaves)"
        return f"{who}: {'in the computation of ' if later else ''}{roles[0]}"

    hit, later = wrote(ev)
    if hit:
        return text(hit, later)
    if not torch:
        # JAX: an equation computed from a state value of this step (mu / (1 - b1^t),
        # the bias correction, reads mu): named by that state
        for r in t.input_rows(ev):
            p = int(r["producer"])
            if 0 <= p < ev:
                got, _ = wrote(p)
                if got and len({_role_text(n) for n in got}) == 1:
                    return f"{who}: computed from {_role_text(got[0])}"
        return None
    if phase != schema.PHASE_OPTIM:
        return None
    # a torch optimizer op that wrote no state: the first state it flows into
    inp = t.inputs
    frontier, seen = [ev], {ev}
    for _ in range(4):
        nxt = []
        for e in frontier:
            for c in np.unique(inp["event"][inp["producer"] == e]).tolist():
                c = int(c)
                if c in seen or c > snap or int(events["phase"][c]) != schema.PHASE_OPTIM:
                    continue
                seen.add(c)
                got, _ = wrote(c)
                if got:
                    return text(got, True)
                nxt.append(c)
        frontier = nxt
    return None


# -- layouts and decoupled weight decay (the per-step comparison, pairing/cross.py) --------------------

ROLE_ORDER = ("grads", "state:exp_avg", "state:momentum_buffer", "state:exp_avg_sq", "state:sum",
              "params")   # the order a step computes them: a difference upstream comes first


def _leaf_path(name, fw):
    """The parameter path of a snapshot value name, leaf unmapped ('fc1/kernel',
    'fc1.weight'); None for the step counter."""
    name = name[0] if isinstance(name, tuple) else name
    parts = name.split("/")
    if fw == "jax":
        parts = _unwrapped(parts)
        if parts[0] == "state":
            parts = parts[2:]
        elif parts[0] in ("params", "grads", "updates"):
            parts = parts[1:]
        p = _jax_param("/".join(parts))
        return p[2] if p else None
    if parts[0] == "state" and len(parts) == 3:
        return parts[1]
    return parts[1] if len(parts) == 2 else None


def kernel_perm(name_a, fw_a, name_b, fw_b, ndim):
    """The axis order that lays b's value out like a's when one side is a Flax `kernel`
    (Dense `(in, out)`, Conv HWIO) and the other a torch `weight` (`(out, in)`, OIHW):
    decided by role, never by shape (a square 64x64 projection is transposed too). None
    when no transposition is due (biases, scales, embeddings, two of one framework)."""
    if fw_a == fw_b or ndim < 2:
        return None
    pa, pb = _leaf_path(name_a, fw_a), _leaf_path(name_b, fw_b)
    if pa is None or pb is None:
        return None
    jax_path, torch_path = (pa, pb) if fw_a == "jax" else (pb, pa)
    if jax_path.rsplit("/", 1)[-1] != "kernel" or torch_path.rsplit(".", 1)[-1] != "weight":
        return None
    to_flax = tuple(range(2, ndim)) + (1, 0)          # torch (O, I, *k) -> flax (*k, I, O)
    return to_flax if fw_a == "jax" else tuple(int(i) for i in np.argsort(to_flax))


def param_name(name_a, fw_a, name_b, fw_b):
    """The parameter as a user names it: torch's `named_parameters()` name when one side
    is torch ('embeddings.LayerNorm.weight'), else a's path."""
    if fw_b == "torch":
        return _leaf_path(name_b, fw_b) or after_step_name(name_b)
    if fw_a == "torch":
        return _leaf_path(name_a, fw_a) or after_step_name(name_a)
    return _leaf_path(name_a, fw_a) or after_step_name(name_a)


def leaf_kind(name_a, fw_a, name_b, fw_b):
    """'bias', 'scale' (a LayerNorm / BatchNorm gain), 'embedding' or 'kernel' (a weight
    matrix): what a weight-decay mask usually tells apart."""
    jax_name, fw = (name_a, fw_a) if fw_a == "jax" else (name_b, fw_b)
    path = _leaf_path(jax_name, fw) or ""
    leaf = path.rsplit("/" if fw == "jax" else ".", 1)[-1]
    if fw != "jax" and leaf == "weight":
        low = path.lower()
        leaf = "scale" if ("norm" in low or ".ln" in low or low.startswith("ln")) else "kernel"
    return {"kernel": "kernel", "scale": "scale", "embedding": "embedding",
            "bias": "bias"}.get(leaf, leaf)


MASK_WORDS = {"bias": "biases", "scale": "LayerNorm scales", "embedding": "embeddings",
              "kernel": "weight matrices"}


def decay_fit(diff, before):
    """(c, residual): `diff` (a - b after the step) as c times the parameter before the
    step, least squares, and ||diff - c * before|| / ||diff||. Decoupled weight decay
    (AdamW: p <- p - lr * (update + wd * p)) applied on one side only leaves exactly
    lr * wd * p; a residual near 0 says that is the whole difference."""
    d = np.asarray(diff, np.float64).reshape(-1)
    p = np.asarray(before, np.float64).reshape(-1)
    pp = float(p @ p)
    dd = float(np.sqrt(d @ d))
    if pp == 0.0 or dd == 0.0 or d.shape != p.shape:
        return None, None
    c = float(d @ p) / pp
    return c, float(np.linalg.norm(d - c * p)) / dd
