"""The optimizer settings two frameworks recorded (the `optim_settings` table, docs/format.md)
read under one set of names, so that a parameter's settings can be compared by role.

Why: where two ports' grads agree and the optimizer state or step does not, the cause is
the optimizer: its settings ("b2 0.95 vs 0.999") or its implementation. torch holds them in
`param_groups` (per group: a parameter's settings are its group's), optax in the closures of
its transformations (`chain/0/scale_by_adam/b2`; the learning rate is `scale`'s `step_size`,
negated) or, under `inject_hyperparams`, in its state (`state/hyperparams/b2`).

Names: lr, b1, b2, eps, weight_decay, momentum, nesterov, decoupled_weight_decay. A setting
one side lacks (a schedule's learning rate, torch's `amsgrad`) is not compared.
"""

import math

COMPARED = ("lr", "b1", "b2", "eps", "weight_decay", "momentum", "nesterov",
            "decoupled_weight_decay")
_TORCH = {"lr": "lr", "betas/0": "b1", "betas/1": "b2", "eps": "eps",
          "weight_decay": "weight_decay", "momentum": "momentum", "nesterov": "nesterov",
          "decoupled_weight_decay": "decoupled_weight_decay"}
_ADAM_LEAVES = ("b1", "b2", "eps", "nesterov")
_HYPER = {"learning_rate": "lr", "b1": "b1", "b2": "b2", "eps": "eps",
          "weight_decay": "weight_decay", "momentum": "momentum", "nesterov": "nesterov"}
HYPER_PREFIX = "state/hyperparams/"   # inject_hyperparams' state, in optax's snapshot
REL = 1e-6      # two numbers this close are one setting (0.95 in float32 and in float64)


class Setting:
    """One setting of one side: its number (NaN: none), text, and where it holds."""

    __slots__ = ("value", "text", "where")

    def __init__(self, value, text, where=""):
        self.value, self.text, self.where = value, text, where

    def same(self, other):
        a, b = self.value, other.value
        if math.isnan(a) or math.isnan(b):
            return self.text == other.text
        return abs(a - b) <= REL * max(abs(a), abs(b))


def _num_text(x):
    return f"{x:.6g}"


def torch_side(rows, param_names, param):
    """{name: Setting} of torch parameter `param` (its group's settings); `rows` the
    event's (group, key, value, text), `param_names` the snapshot's parameter names in
    the order they were stored (group by group). None where nothing was recorded."""
    counts = {g: int(v) for g, k, v, _ in rows if k == "params" and v == v}
    if not counts:
        return None
    group, start = None, 0
    for g in sorted(counts):
        if param in param_names[start:start + counts[g]]:
            group = g
            break
        start += counts[g]
    if group is None:
        return None
    texts = {}     # key -> the texts of every group: a group is named where they differ
    for g, k, v, t in rows:
        texts.setdefault(k, set()).add(t)
    out = {}
    for g, k, v, t in rows:
        if g == group and k in _TORCH:
            where = f"param group {group}" if len(texts[k]) > 1 else ""
            out[_TORCH[k]] = Setting(v, t, where)
    return out


def optax_side(rows, hyper):
    """{name: Setting} of an optax optimizer: its closures' settings (`rows`), then the
    hyperparameters `inject_hyperparams` keeps in its state (`hyper`: {name: number})."""
    out = {}
    adam_at = decay_at = None
    lr = None
    for _, key, v, t in rows:
        parts = key.split("/")
        leaf, factory = parts[-1], parts[-2] if len(parts) > 1 else ""
        at = next((int(p) for p in parts if p.isdigit()), None)
        if factory.startswith("scale_by_") and leaf in _ADAM_LEAVES and leaf not in out:
            out[leaf] = Setting(v, t)
            adam_at = at
        elif factory == "add_decayed_weights" and leaf == "weight_decay":
            masked = "masked" in parts
            out["weight_decay"] = Setting(v, t, "where its mask holds" if masked else "")
            decay_at = at
        elif factory == "scale" and leaf == "step_size" and v == v:
            lr = Setting(-v, _num_text(-v))       # the last `scale`: the learning rate
        elif factory == "trace" and leaf in ("decay", "nesterov"):
            out["momentum" if leaf == "decay" else "nesterov"] = Setting(v, t)
        elif factory == "other_hps" and leaf in _HYPER:
            out[_HYPER[leaf]] = Setting(v, t)
    if lr is not None:
        out["lr"] = lr
    if adam_at is not None and decay_at is not None and "weight_decay" in out:
        d = decay_at > adam_at       # decay added to Adam's update: decoupled (AdamW)
        out["decoupled_weight_decay"] = Setting(float(d), str(d))
    for k, v in (hyper or {}).items():
        if k in _HYPER:
            out[_HYPER[k]] = Setting(float(v), _num_text(float(v)))
    return out or None


def differences(sa, sb):
    """[(name, a Setting, b Setting)] of the settings both sides recorded that differ, in
    `COMPARED`'s order; `sa`/`sb` from `torch_side` / `optax_side`."""
    return [(k, sa[k], sb[k]) for k in COMPARED if k in sa and k in sb and not sa[k].same(sb[k])]


def compared(sa, sb):
    """The names both sides recorded."""
    return [k for k in COMPARED if k in sa and k in sb]


def describe(diffs):
    """'b2 0.95 vs 0.999, eps 1e-06 vs 1e-08' (a's value first; where it holds, if only in
    part: 'weight_decay 0.1 vs 0.0 (b: param group 1)')."""
    out = []
    for k, a, b in diffs:
        where = "; ".join(f"{side}: {s.where}" for side, s in (("a", a), ("b", b)) if s.where)
        out.append(f"{k} {a.text} vs {b.text}" + (f" ({where})" if where else ""))
    return ", ".join(out)
