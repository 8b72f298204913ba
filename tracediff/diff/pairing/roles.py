"""The optimizer steps of two frameworks compared by role (`CrossDiffer.optimizer_steps`).

optax and torch.optim snapshot different things at different moments (`align/optroles.py`
pairs them by role): per step, the parameters, grads and optimizer state are judged per
tensor, b laid out like a by role (a Flax kernel is a transposed torch weight), and the
first value beyond tolerance is named, in the order a step computes them; parameters that
differ by a fixed fraction of their value before the step are decoupled weight decay
applied on one side only (a weight-decay mask).
"""

import numpy as np

from ...trace import schema
from ...trace.values import has_bytes as comparable, parse_shape
from ..align import optroles
from ..compare import values as compare
from ..result import OptimizerStep, ParamDivergence
from .layers import _num
from .optcause import OptimizerCause

DECAY_RESIDUAL = 0.05  # (a - b) within 5% of c * parameter: decoupled weight decay
DECAY_SPREAD = 0.05    # parameters with the same c (within 5%): one weight decay, one mask
NOISE_GRAD = 1e-3      # a gradient element whose sides differ by more: rounding noise
NOISE_TENSOR = 0.5     # a gradient whose sides differ by more (relative L2): noise throughout


class RoleSteps(OptimizerCause):
    """The optimizer snapshots of a `CrossDiffer`, paired and judged by role."""

    def _optim_pairs(self, ta, tb, sa, sb):
        ea = np.flatnonzero((sa.kind == schema.KIND_OPTIM) & (ta.events["framework"] == self.fw_a))
        eb = np.flatnonzero((sb.kind == schema.KIND_OPTIM) & (tb.events["framework"] == self.fw_b))
        return list(zip(ea.tolist(), eb.tolist()))

    @staticmethod
    def _named(t, e):
        return {t.string(r["name"]): r for r in t.value_rows(e, schema.ROLE_OUT) if r["name"] >= 0}

    def _fw_name(self, fw):
        return schema.FW_NAMES.get(fw, "")

    def _roles(self, ea, eb, module_map):
        na, nb = self._named(self.ta, ea), self._named(self.tb, eb)
        sizes_a = {k: int(np.prod(parse_shape(self.ta.string(r["shape"])) or (1,))) for k, r in na.items()}
        sizes_b = {k: int(np.prod(parse_shape(self.tb.string(r["shape"])) or (1,))) for k, r in nb.items()}
        return na, nb, optroles.role_pairs(list(na), self._fw_name(self.fw_a), list(nb),
                                           self._fw_name(self.fw_b), sizes_a, sizes_b, module_map)

    def _role_rows(self, module_map):
        """Value rows of the same parameter after each optimizer step on both sides: optax
        snapshots the params before its step (the next snapshot holds them after), torch
        after."""
        ta, tb = self.ta, self.tb
        out = []
        for k, (ea, eb) in enumerate(self.optim):
            na, nb, pairs = self._roles(ea, eb, module_map)
            nxt = self.optim[k + 1] if k + 1 < len(self.optim) else None
            for role, xa, xb, _ in pairs:
                if role != "params" or nxt is None:
                    continue
                if isinstance(xa, tuple):
                    ra = self._named(ta, nxt[0]).get(xa[0])
                    rb = nb.get(xb)
                elif isinstance(xb, tuple):
                    ra = na.get(xa)
                    rb = self._named(tb, nxt[1]).get(xb[0])
                else:
                    ra, rb = na.get(xa), nb.get(xb)
                if ra is not None and rb is not None:
                    out.append((ra, rb))
        return out

    def _snapshot_value(self, t, reader, named, name):
        """A snapshot value by name; for optax (params, updates): params + updates, the
        parameters after the step (what optax.apply_updates computes)."""
        if isinstance(name, tuple):
            p, u = (named.get(n) for n in name)
            if p is None or u is None or not comparable(p) or not comparable(u):
                return None, None
            xp, xu = reader.read(p), reader.read(u)
            return np.asarray(xp + xu).astype(xp.dtype), t.string(p["dtype"])
        r = named.get(name)
        if r is None or not comparable(r):
            return None, None
        return reader.read(r), t.string(r["dtype"])

    def _role_layout(self, xa_name, xb_name, xa, xb):
        """b's value laid out like a's by role: a Flax kernel against a torch weight is
        transposed whatever its shape (a square projection too), anything else as
        `transform_b` lays it out."""
        xa, xb = np.asarray(xa), np.asarray(xb)
        perm = optroles.kernel_perm(xa_name, self._fw_name(self.fw_a), xb_name,
                                    self._fw_name(self.fw_b), xb.ndim)
        if perm is not None and xb.ndim == xa.ndim and \
                tuple(xb.shape[i] for i in perm) == xa.shape:
            return np.transpose(xb, perm)
        return self.transform_b(None, None, xa, xb)

    def _before_step(self, xa_name, xb_name, na, nb, xa):
        """The parameter before the step, laid out like a: optax's snapshot holds it
        (`params/...`, what `update` was given); None when neither side is optax."""
        if isinstance(xa_name, tuple):
            r = na.get(xa_name[0])
            return self.ra.read(r) if r is not None and comparable(r) else None
        if isinstance(xb_name, tuple):
            r = nb.get(xb_name[0])
            if r is None or not comparable(r):
                return None
            return self._role_layout(xa_name, xb_name, xa, self.rb.read(r))
        return None

    def _param_ranks(self, na, nb):
        """{value name: position} of the side that lists parameters in the model's order:
        torch's snapshot, as `named_parameters()` does (optax's pytree is sorted by name)."""
        names = nb if self._fw_name(self.fw_b) == "torch" else na
        return {k: i for i, k in enumerate(names)}

    def optimizer_steps(self):
        """Per optimizer step: the parameters, grads and optimizer state paired by role (b
        laid out like a by role, `_role_layout`), each judged per tensor; the first value
        beyond tolerance of each step (`OptimizerStep.first_beyond`) and of the run
        (`self.first_parameter`)."""
        if getattr(self, "_steps", None) is not None:
            return self._steps      # the search asked first (`_undetermined_inherited`)
        rows = []
        self.first_parameter = None
        self.undetermined_hashes = (set(), set())
        noisy_before = {}     # parameter -> elements undetermined in an earlier step
        und_before = set()    # parameters undetermined after an earlier step
        fa, fb = self._fw_name(self.fw_a), self._fw_name(self.fw_b)
        for ea, eb in self.optim:
            na, nb, pairs = self._roles(ea, eb, self.p.module_map)
            step = int(self.ta.events["step"][ea])
            worst_rel, worst_abs, bit, n = 0.0, 0.0, True, 0
            candidates = []       # (measure where determined or None, whole, max abs, name)
            l2 = compare.RelL2()
            judged = []
            order, ranks = {}, self._param_ranks(na, nb)
            side_b = self._fw_name(self.fw_b) == "torch"
            noisy = {}            # parameter -> its gradient's elements that are noise
            shifted_grads = set()  # parameters whose grads are judged `shifted`
            for role, xa_name, xb_name, _ in sorted(pairs, key=lambda p: p[0] != "grads"):
                xa, da = self._snapshot_value(self.ta, self.ra, na, xa_name)
                xb, db = self._snapshot_value(self.tb, self.rb, nb, xb_name)
                if xa is None or xb is None:
                    continue
                xb_t = self._role_layout(xa_name, xb_name, xa, xb)
                m = self.compare_values(xa, xb_t, da, db)
                n += 1
                bit &= m["bitwise_equal"]
                if role == "count":
                    continue
                own = compare.RelL2()   # this tensor's ||a - b|| / ||a||
                own.add(xa, xb_t)
                v = whole = own.value() if not m["bitwise_equal"] else 0.0
                pname = optroles.param_name(xa_name, fa, xb_name, fb)
                if role == "params":   # the model's order: torch's named_parameters()
                    x = xb_name if side_b else xa_name
                    order[pname] = ranks.get(x[0] if isinstance(x, tuple) else x, 1 << 30)
                    l2.add(xa, xb_t)
                    worst_rel = max(worst_rel, _num(m.get("max_rel")))
                    worst_abs = max(worst_abs, _num(m.get("max_abs")))
                floats = [x for x in (da, db) if compare.is_floating(x)] or [da]
                rtol, atol = compare.tolerance(max(floats, key=lambda x: compare.tolerance(x)[0]),
                                               self.rtol, self.atol)
                beyond = bool(np.sqrt(own.diff) > rtol * np.sqrt(own.ref) +
                              atol * np.sqrt(np.asarray(xa).size))
                shifted = False
                if beyond and und_before and (role == "grads" or (
                        role.startswith("state:") and pname in shifted_grads)):
                    # computed from parameters the program left undetermined (each side's
                    # noise stepped by Adam), or the optimizer state of such grads: what
                    # they shift, not judged (`OptimizerStep.shifted`)
                    beyond, shifted = False, True
                    if role == "grads":
                        shifted_grads.add(pname)
                if role == "grads":   # an element once undetermined stays so
                    mask = noise_elements(xa, xb_t)
                    prev = noisy_before.get(pname)
                    if prev is not None and prev.shape == mask.shape:
                        mask = mask | prev
                    if mask.any():
                        noisy[pname] = noisy_before[pname] = mask
                fit, undetermined = (None, None), False
                keep = ~noisy[pname] if pname in noisy and role == "params" else Ellipsis
                before = self._before_step(xa_name, xb_name, na, nb, xa) \
                    if role == "params" and beyond else None
                if before is not None:   # decoupled weight decay? (no arrays kept)
                    fit = optroles.decay_fit(np.asarray(xa, np.float64) -
                                             np.asarray(xb_t, np.float64), before)
                if role == "params" and beyond and keep is not Ellipsis and \
                        not (fit[0] is not None and fit[1] < DECAY_RESIDUAL):
                    # not decay as a whole (which the program determines, noise or not):
                    # judged, and its difference measured, where its gradient is no noise
                    v = _rel_where(xa, xb_t, keep)
                    beyond = beyond_where_determined(xa, xb_t, keep, rtol, atol)
                    undetermined = not beyond
                    if beyond and before is not None:
                        fit = optroles.decay_fit(np.asarray(xa, np.float64)[keep] -
                                                 np.asarray(xb_t, np.float64)[keep],
                                                 np.asarray(before)[keep])
                if role == "params" and whole:
                    candidates.append(worst_candidate(
                        noisy.get(pname), f"{optroles.after_step_name(xa_name)} <-> "
                        f"{optroles.after_step_name(xb_name)}", whole, _num(m.get("max_abs"))))
                judged.append(dict(role=role, pname=pname, xa_name=xa_name, xb_name=xb_name,
                                   rel=v, max_abs=_num(m.get("max_abs")), rtol=rtol,
                                   atol=atol, beyond=beyond, fit=fit, undetermined=undetermined,
                                   shifted=shifted))
            noise = [j["pname"] for j in judged if j["undetermined"]]
            shifted_names = list(dict.fromkeys(j["pname"] for j in judged if j["shifted"]))
            for j in judged:
                if j["undetermined"]:
                    for side, (t, named, x) in enumerate(((self.ta, na, j["xa_name"]),
                                                          (self.tb, nb, j["xb_name"]))):
                        r = None if isinstance(x, tuple) else named.get(x)
                        if r is not None:      # the value the next forward reads
                            self.undetermined_hashes[side].add(int(r["hash"]))
            worst_l2, worst_tabs, worst_name = _worst(candidates)
            first = self._first_beyond(step, ea, eb, judged, order)
            if first is not None and self.first_parameter is None:
                self.first_parameter = first
            rows.append(OptimizerStep(step=step, a=ea, b=eb,
                                      bitwise_equal=bool(bit), max_rel=worst_rel,
                                      max_abs=worst_abs, worst=worst_name, compared=n,
                                      by="role", rel_l2=l2.value() if n else None,
                                      worst_rel_l2=worst_l2, worst_max_abs=worst_tabs,
                                      beyond=sum(j["beyond"] for j in judged),
                                      first_beyond=first,
                                      undetermined=sorted(noise, key=lambda x: order.get(x, 0))
                                      or None,
                                      shifted=sorted(shifted_names, key=lambda x: order.get(x, 0))
                                      or None))
            und_before.update(noise)
        self._steps = rows
        return rows

    def _first_beyond(self, step, ea, eb, judged, order):
        """The `ParamDivergence` of one step: its first value beyond tolerance, the roles in
        the order a step computes them (grads, state, parameters after the step), the
        parameters in the model's order; for parameters after the step whose grads and
        state match, whether decoupled weight decay explains the difference."""
        bad = [j for j in judged if j["beyond"]]
        if not bad:
            return None
        rank = {r: i for i, r in enumerate(optroles.ROLE_ORDER)}
        bad.sort(key=lambda j: (rank.get(j["role"], len(rank)), order.get(j["pname"], 1 << 30)))
        j = bad[0]
        upstream = [u for u in judged if u["pname"] == j["pname"] and u["role"] != "params"]
        res = ParamDivergence(
            step=step, parameter=j["pname"], role=j["role"].split(":")[-1],
            a=optroles.after_step_name(j["xa_name"]), b=optroles.after_step_name(j["xb_name"]),
            a_event=ea, b_event=eb, rel_l2=float(j["rel"]), max_abs=float(j["max_abs"]),
            rtol=float(j["rtol"]), atol=float(j["atol"]),
            upstream_match=(not any(u["beyond"] for u in upstream)) if upstream else None)
        if j["role"] == "grads":
            res.note = (f"the {res.role} differ before the optimizer updates anything: the "
                        f"divergence is upstream (the forward or backward pass)")
            return res
        if j["role"] != "params":
            grads = [u for u in upstream if u["role"] == "grads"]
            if not grads:
                res.note = (f"the {res.role} differs; its grads were not compared, so "
                            f"whether the divergence starts before the optimizer is not known")
                return res
            res.note = (f"its grads match (relative L2 {grads[0]['rel']:.3g}) and its "
                        f"{res.role} does not: {self._optimizer_cause(res, ea, eb)}")
            return res
        fa, fb = self._fw_name(self.fw_a), self._fw_name(self.fw_b)
        fits = {}
        for p in judged:
            c, resid = p["fit"]
            if p["role"] == "params" and p["beyond"] and c is not None and resid < DECAY_RESIDUAL:
                fits[p["pname"]] = (c, p)
        if j["pname"] not in fits:
            res.weight_decay = False
            res.note = ("the parameter differs after the step" +
                        (" while its grads and optimizer state match: the update rule differs; "
                         + self._optimizer_cause(res, ea, eb) if res.upstream_match else ""))
            return res
        c0 = fits[j["pname"]][0]
        same = [name for name, (c, _) in fits.items() if abs(c - c0) <= DECAY_SPREAD * abs(c0)]
        same.sort(key=lambda x: order.get(x, 1 << 30))
        res.weight_decay, res.decay, res.decay_parameters = True, c0, same
        res.note = _decay_note(c0, same, judged, fa, fb, res.upstream_match) + \
            self._decay_settings(res, ea, eb)
        return res


def noise_elements(ga, gb):
    """The elements of a gradient that are rounding noise: the two sides' values apart by
    more than `NOISE_GRAD` of the larger (a key projection's bias, whose gradient softmax
    makes zero but for rounding; a BatchNorm bias before a ReLU that no element passes). A
    normalising optimizer (Adam's m / (sqrt(v) + eps)) turns each side's noise into a step
    of its own sign and size, up to lr: the parameter there after the step is not determined
    by the program."""
    ga, gb = np.asarray(ga, np.float64), np.asarray(gb, np.float64)
    noise = np.abs(ga - gb) > NOISE_GRAD * np.maximum(np.abs(ga), np.abs(gb))
    big = max(float(np.linalg.norm(ga)), float(np.linalg.norm(gb)))
    if big and float(np.linalg.norm(ga - gb)) > NOISE_TENSOR * big:
        # the whole gradient is noise: an element where the two sides happen to agree is
        # not determined by the program (HF CLIP's key bias: 1 of 32 elements within 1e-3
        # by chance read as "determined", and its decay on that one element as the finding)
        noise[...] = True
    return noise


def _rel_where(xa, xb, keep):
    """||a - b|| / ||a|| over the elements `keep`."""
    a, b = np.asarray(xa, np.float64)[keep], np.asarray(xb, np.float64)[keep]
    na = float(np.linalg.norm(a))
    return float(np.linalg.norm(a - b)) / na if na else 0.0


def beyond_where_determined(xa, xb, keep, rtol, atol):
    """A parameter after the step beyond tolerance on its determined elements (`keep`, where
    its gradient is no noise): ||a - b|| > rtol ||a|| + atol sqrt(n) over those; a parameter
    that differs only where its gradient is noise is undetermined, not beyond."""
    a, b = np.asarray(xa, np.float64)[keep], np.asarray(xb, np.float64)[keep]
    return bool(np.linalg.norm(a - b) > rtol * np.linalg.norm(a) + atol * np.sqrt(a.size))


def _decay_note(c, same, judged, fw_a, fw_b, upstream_match):
    """'a (jax) applies no decoupled weight decay to its biases and LayerNorm scales (b
    decays them: the difference is 0.0001 x the parameter before the step, lr * wd): a
    weight-decay mask on one side'."""
    less, more = ("a", "b") if c > 0 else ("b", "a")
    fw = {"a": fw_a, "b": fw_b}
    kinds_all, kinds_same = {}, {}
    for j in judged:
        if j["role"] != "params":
            continue
        k = optroles.leaf_kind(j["xa_name"], fw_a, j["xb_name"], fw_b)
        kinds_all[k] = kinds_all.get(k, 0) + 1
        if j["pname"] in same:
            kinds_same[k] = kinds_same.get(k, 0) + 1
    what = []
    for k, cnt in sorted(kinds_same.items(), key=lambda kv: -kv[1]):
        word = optroles.MASK_WORDS.get(k, k)
        what.append(f"its {word}" if cnt == kinds_all.get(k) else f"{cnt} of its {kinds_all[k]} {word}")
    return (f"{less} ({fw[less]}) applies {abs(c):.3g} less decoupled weight decay than {more} "
            f"({fw[more]}) to {' and '.join(what)} ({len(same)} parameters; the difference is "
            f"{abs(c):.3g} x the parameter before the step, lr * weight_decay"
            f"{', while grads and optimizer state match' if upstream_match else ''}): "
            f"a weight-decay mask on one side")


def worst_candidate(mask, name, whole, tabs):
    """(its relative L2, or None where the parameter's gradient is rounding noise
    throughout; the same whole; its max abs; the pair's name) of one parameter after the
    step, for the step's worst (`_worst`). A gradient that is noise throughout (a key
    projection's bias, which softmax makes zero but for rounding) says nothing of what a
    bug changed: Adam makes each side's noise a step of up to lr of its own."""
    if mask is not None and mask.size and mask.all():
        return None, whole, tabs, tabs, name
    return whole, whole, tabs, tabs, name


def _worst(candidates):
    """(relative L2, max abs, name) of a step's worst parameter after the step: the largest
    relative L2 among parameters whose gradient is not rounding noise throughout; one whose
    gradient is (a key projection's bias) only when no other parameter differs."""
    real = [c for c in candidates if c[0]]
    if real:
        c = max(real, key=lambda c: c[0])
        return c[0], c[2], c[4]
    if candidates:
        c = max(candidates, key=lambda c: c[1])
        return c[1], c[3], c[4]
    return None, None, None
