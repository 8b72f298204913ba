"""Degenerate pairs of real recordings for the sources of a difference (explain/sources.py):
a program change blamed on the hardware, shares that are not finite or do not add up, a
lone source ranked at 0 %, a pair with nothing to share."""

import json
import math
import os
import subprocess
import sys

PROGRAM = """
import sys, torch
k, c, d, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
x = torch.tensor([1.0, -2.0, 3.0, 0.5])
if k == "scale":
    y = x * c
elif k == "both":
    y = (x * c).sum() + (torch.tensor([4.0, 5.0]) / d).sum()
elif k == "shape":
    y = x[:n].sum()
elif k == "dtype":
    y = (x.double() if c else x) * 2
elif k == "nan":
    y = torch.log(x * c)
elif k == "blowup":
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=c)
    for _ in range(60):
        opt.zero_grad(); ((w * x) ** 2).sum().backward(); opt.step()
    y = w.detach()
print(y)
"""


def _pair(work, a_args, b_args, level="full"):
    script = os.path.join(work, "p.py")
    with open(script, "w") as f:
        f.write(PROGRAM)
    out = []
    for name, args in (("a", a_args), ("b", b_args)):
        path = os.path.join(work, f"{name}.h5")
        proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "--level", level,
                               "-o", path, script, *map(str, args)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-300:])
        out.append(path)
    proc = subprocess.run([sys.executable, "-m", "tracediff", "locate", "--json", *out],
                          capture_output=True, text=True, timeout=300)
    return json.loads(proc.stdout)


def _shares_ok(srcs):
    """Finite and adding up to 1, or all absent with a reason."""
    shares = [s["share"] for s in srcs["sources"]]
    if not shares:
        return True
    if all(x is None for x in shares):
        return bool(srcs.get("no_shares"))
    return all(isinstance(x, float) and math.isfinite(x) for x in shares) and \
        abs(sum(shares) - 1) < 1e-6


def _says(srcs):
    return "; ".join(f"{s['share'] if s['share'] is None else round(s['share'], 3)} "
                     f"{s['mechanism']} {s.get('arguments', '')}" for s in srcs["sources"])[:150] \
        or srcs.get("note", "")[:150]


def _attack(a, b, check, level="full"):
    def attack(work):
        doc = _pair(work, a, b, level)
        srcs = doc.get("sources") or {"sources": []}
        ok = _shares_ok(srcs) and check(doc, srcs) and \
            not any("nan%" in s["text"] or "hardware" in s["fix"] and s["mechanism"] == "arguments"
                    for s in srcs["sources"])
        return ok, f"{doc['verdict']}: {_says(srcs) or srcs.get('note', '')}"
    return attack


def _args(doc, srcs):
    return [s["mechanism"] for s in srcs["sources"]] == ["arguments"]


ATTACKS = [
    ("identical runs: no source", _attack(("scale", 2, 1, 4), ("scale", 2, 1, 4),
                                          lambda d, s: d["verdict"] == "match" and not s["sources"])),
    ("a scalar argument differs (x * 2 vs x * 3)", _attack(("scale", 2, 1, 4), ("scale", 3, 1, 4), _args)),
    ("the sign of a zero argument (x * 0.0 vs x * -0.0)",
     _attack(("scale", 0.0, 1, 4), ("scale", -0.0, 1, 4),
             lambda d, s: _args(d, s) and s["sources"][0]["share"] == 1.0)),
    ("the same at --level stats", _attack(("scale", 0.0, 1, 4), ("scale", -0.0, 1, 4),
                                          lambda d, s: s["sources"][0]["share"] == 1.0, "stats")),
    ("a division by zero beside a finite change",
     _attack(("both", 2, 1, 4), ("both", 3, 0, 4),
             lambda d, s: len(s["sources"]) == 2 and "not finite" in s["no_shares"])),
    ("a slice's end changed (x[:3] vs x[:4]): two unpaired ops",
     _attack(("shape", 1, 1, 3), ("shape", 1, 1, 4),
             lambda d, s: "runs executed different ops" in s.get("note", "") and
             "aten::slice" in s["note"])),
    ("another dtype (float64 on b)", _attack(("dtype", 0, 1, 4), ("dtype", 1, 1, 4),
                                             lambda d, s: True)),
    ("NaN on both sides alike", _attack(("nan", 1, 1, 4), ("nan", 1, 1, 4),
                                        lambda d, s: not s["sources"])),
    ("NaN on one side (log of a negative)", _attack(("nan", 1, 1, 4), ("nan", -1, 1, 4), _args)),
    ("parameters blown up to Inf on one side",
     _attack(("blowup", 0.01, 1, 4), ("blowup", 0.6, 1, 4), lambda d, s: bool(s["sources"]))),
]
