"""Where a NaN came from (diff/nonfinite/, `tracediff info`) on traces meant to mislead it
or make it work without end: a mask's -inf everywhere, a NaN in the data, a literal NaN,
and copies of real traces edited into dataflow cycles and floods of non-finite values."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

PROGRAM = """
import sys, torch
k = sys.argv[1]
x = torch.linspace(-1.0, 1.0, 8)
if k == "masks":
    q = torch.randn(64, 4, 8)
    m = torch.full((4, 4), float("-inf")).triu(1)
    for _ in range(200):                       # 200 masks absorbed, no NaN kept
        p = torch.softmax(q @ q.transpose(1, 2) + m, -1)
    print(p.sum().item())
elif k == "data":
    data = torch.tensor([1.0, float("nan"), 3.0])   # the data holds NaN from the start
    print((data * 2).sum().item())
elif k == "literal":
    print(torch.where(x > 0, x, torch.tensor(float("nan"))).sum().item())
elif k == "clean":
    print((x * 2).sum().item())
"""


def _record(work, kind, level="full"):
    script = os.path.join(work, "p.py")
    with open(script, "w") as f:
        f.write(PROGRAM)
    path = os.path.join(work, f"{kind}.h5")
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "--level", level, "-o",
                           path, script, kind], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-300:])
    return path


def _info(path, timeout=60):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracediff", "info", "--json", path],
                          capture_output=True, text=True, timeout=timeout)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        return None, proc.stderr.strip()[:150], took
    return json.loads(proc.stdout)["first_nonfinite"], "", took


def _masks(work):
    nf, err, took = _info(_record(work, "masks"))
    held = nf is not None and nf["kept"] is False and took < 30
    return held, f"{err or ('kept ' + str(nf['kept']) + ': ' + nf['op'])} in {took:.1f} s"


def _data(work):
    nf, err, _ = _info(_record(work, "data"))
    held = nf is not None and nf["inputs_finite"] is False
    return held, err or f"{nf['op']}: {nf['mechanism']}"


def _literal(work):
    nf, err, _ = _info(_record(work, "literal"))
    return nf is not None and nf["kept"], err or f"{nf['op']} ({nf['event_kind']}): {nf['mechanism']}"


def _clean(work):
    nf, err, _ = _info(_record(work, "clean"))
    return nf is None and not err, err or "every value finite: null"


def _edited(work, edit, level="full"):
    import h5py

    src = _record(work, "masks", level)
    path = os.path.join(work, "edited.h5")
    shutil.copy(src, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    nf, err, took = _info(path, timeout=120)
    return (err == "" or err.startswith("tracediff: error")) and took < 60, \
        f"{err or (nf and nf['op'])} in {took:.1f} s"


def _cycle(f):
    """Every input row points at the event after its own: the dataflow runs in circles."""
    rows = f["inputs"][:]
    n = f["events"].shape[0]
    rows["producer"] = np.minimum(rows["event"] + 1, n - 1)
    f["inputs"][:] = rows


def _all_nan(f):
    """Every statistics row says NaN: a flood of non-finite values with no root."""
    st = f["stats"][:]
    st["nan"] = 7
    f["stats"][:] = st


ATTACKS = [
    ("one mask read 200 times, absorbed each time", _masks),
    ("NaN in the data from the start", _data),
    ("a literal NaN in a where", _literal),
    ("a clean run", _clean),
    ("a trace whose dataflow runs in circles", lambda w: _edited(w, _cycle)),
    ("every statistic NaN (stats trace)", lambda w: _edited(w, _all_nan, "stats")),
]
