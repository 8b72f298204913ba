"""Which module of one side is which of the other's: learned from paired units (their
paths aligned from the common end), the user's module map (`--map`) that confines units to
each other, and where a module's run of units ends (its output).
"""

import fnmatch

import numpy as np

from .graph import PHASE_FWD, module_path



class ModuleCorrespondence:
    """Module paths of a `Pairing`'s two sides put in correspondence (see the module docstring)."""

    def _groups(self, g, s):
        """Per unit: the index of the user-map entry whose side-s pattern it matches, or -1."""
        out = np.full(len(g.units), -1, np.int64)
        if not self.user_map:
            return out
        for k, u in enumerate(g.units):
            e = g.t.events[u.rep]
            ns, op = g.t.string(e["name_stack"]), g.t.string(e["op"])
            for i, pats in enumerate(self.user_map):
                pat = pats[s]
                mod = module_path(pat, g.fw) if "*" not in pat and ":" not in pat else None
                if any(fnmatch.fnmatchcase(x, pat) for x in (ns, op, f"{ns}:{op}", u.label,
                                                             u.module)) or \
                        (mod and (u.module == mod or u.module.startswith(mod + "/"))):
                    out[k] = i
                    break
        return out

    def _module_id(self, s, module):
        if s == 0:
            return "m:" + self.module_map.get(module, "a:" + module)
        return "m:" + module if module in self._mapped_b else "b:" + module

    def unit_module(self, s, k):
        """The module path of a unit, without the name scopes that are not modules (jnp.einsum's
        '...qhd,...khd->...hqk')."""
        g = self.ga if s == 0 else self.gb
        return "/".join(c for c in g.units[k].module.split("/")
                        if c and "->" not in c and "," not in c)

    def _learn_modules(self, ma, mb):
        """Paired units in 'M/encoder/layer/0/attention/self/query' and
        'encoder/layer/0/attention/self/query': each ancestor pairs with the ancestor at the
        same distance from the common end ('M' with the top level)."""
        ca, cb = ma.split("/") if ma else [], mb.split("/") if mb else []
        n = 0
        while n < len(ca) and n < len(cb) and ca[-1 - n] == cb[-1 - n]:
            n += 1
        if not n and (ca or cb):
            return
        for i in range(n + 1):
            self._mod_pairs.setdefault("/".join(ca[:len(ca) - i]), "/".join(cb[:len(cb) - i]))

    def counterpart(self, ma):
        """b's module for a's module `ma`: learned from paired units, or its parent's
        counterpart with the same last name; None."""
        hit = self._mod_pairs.get(ma)
        if hit is not None:
            return hit
        if not ma:
            return None
        parent, _, last = ma.rpartition("/")
        up = self.counterpart(parent) if parent != ma else None
        if up is None:
            return None
        return f"{up}/{last}" if up else last

    def _module_ends(self, s, k):
        """The modules (deepest first) whose run of units ends at unit k of side s: the next
        forward unit of that side is outside them."""
        g = self.ga if s == 0 else self.gb
        m = self.unit_module(s, k)
        nxt = next((j for j in range(k + 1, len(g.units)) if g.units[j].phase == PHASE_FWD),
                   None)
        mn = self.unit_module(s, nxt) if nxt is not None else None
        out, cur = [], m
        while True:
            if mn is None or not (cur == "" or mn == cur or mn.startswith(cur + "/")):
                out.append(cur)
            if not cur:
                break
            cur = cur.rpartition("/")[0]
        return out

    def _module_map(self):
        out = {}
        for p in self.pairs:
            ma, mb = self.ga.units[p.a].module, self.gb.units[p.b].module
            out.setdefault(ma, mb)
        self._mapped_b = set(out.values())
        return out
