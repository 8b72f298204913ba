"""Settings and names a recording cannot format: the run goes on as the plain one and the
manifest says what was skipped."""

import os

from .runs import both, manifest, same

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ODD = """
import math, sys, torch
kind = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
if kind == "nan_lr":
    opt = torch.optim.SGD(m.parameters(), lr=float("nan"))
elif kind == "tensor_lr":
    opt = torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01))
elif kind == "unicode":
    opt = torch.optim.SGD([{"params": m.parameters(), "\\u00e9t\\u00e9": 1, "lr": 0.1}])
elif kind == "nested":
    opt = torch.optim.SGD([{"params": m.parameters(), "deep": [[[[[1.0] * 50] * 20]]], "lr": 0.1}])
elif kind == "huge_repr":
    class Big(float):
        def __repr__(self):
            return "x" * 10_000_000
    opt = torch.optim.SGD(m.parameters(), lr=Big(0.1))
x = torch.ones(3, 4)
for _ in range(2):
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
print([round(float(p.sum()), 6) if math.isfinite(float(p.sum())) else "nan" for p in m.parameters()])
"""


def _fixture(name, arg):
    def attack(work):
        program = open(os.path.join(ROOT, "fixtures", name)).read()
        got = both(work, program, arg)
        held, seen = same(got)
        fw = (manifest(work).get("frameworks") or {})
        skipped = {k: v for f in fw.values() if isinstance(f, dict)
                   for k, v in f.items() if k.startswith("skipped")}
        return held and bool(skipped), f"{seen}; manifest {str(skipped)[:80]}"
    return attack


def _odd(kind):
    def attack(work):
        got = both(work, ODD, kind)
        held, seen = same(got)
        stopped = "capture stopped" in got["recorded_stderr"]
        return held and not stopped, seen + ("; the capture stopped" if stopped else "")
    return attack


ATTACKS = [
    ("an lr, a key and a value whose repr, str and float raise (torch)",
     _fixture("torch_unformattable.py", "settings")),
    ("module keys that are not str, a module whose repr and == raise",
     _fixture("torch_unformattable.py", "names")),
    ("an optax closure value whose attributes raise", _fixture("jax_optax_unformattable.py", "x")),
] + [(f"torch optimizer with {k.replace('_', ' ')}", _odd(k))
     for k in ("nan_lr", "tensor_lr", "unicode", "nested", "huge_repr")]
