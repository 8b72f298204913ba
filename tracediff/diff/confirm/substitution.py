"""The runs of `confirm` for sources no setting expresses: the initialiser and the random
inputs (torch). b is re-run with a's recorded values in place of that source's outputs
(`capture/torch/substitute.py` does it in the dispatch mode, from a .npz written here), so
what the run removes is that source's part, measured. The values come from trace a: it
must hold them (recorded at `--level full`); where it does not, the source is left out and
confirm says why.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

from ...trace import schema
from ...trace.values import has_bytes
from ..explain.sources import is_initialiser
from . import runs as _runs

MECHANISMS = ("initialiser", "random_data")
_DIGITS = re.compile(r"\d+")
_NUMPY_DTYPES = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8",
                 "bool"}


def _members(d, src):
    """(a event, b event) of every paired RNG op whose outputs differ, of this source's ops
    and modules."""
    ops = {op for op, _ in src.ops}
    modules = set(src.modules or [])
    ia, ib = d.candidate_pairs()
    out = []
    for ea, eb in zip(ia.tolist(), ib.tolist()):
        e = d.ta.events[ea]
        if d.ta.string(e["op"]) not in ops or not is_initialiser(d.ta, ea):
            continue
        module = _DIGITS.sub("*", d.ta.string(e["name_stack"])) or "(top level)"
        if modules and module not in modules and d.ta.string(e["name_stack"]) not in modules:
            continue
        out.append((ea, eb))
    return out


def _values(d, members):
    """({"e<b event>_<slot>": a's array}, {b event: op}) or (None, why)."""
    arrays, ops = {}, {}
    for ea, eb in members:
        rows = d.ta.value_rows(ea, schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        for r in rows:
            if d.ta.string(r["dtype"]) not in _NUMPY_DTYPES:
                return None, f"{d.ta.string(r['dtype'])} values cannot be substituted yet"
            x = d.ra.read(r) if has_bytes(r) else None
            if x is None:
                return None, ("trace a holds no bytes of these values (record it at "
                              "--level full)")
            arrays[f"e{eb}_{int(r['slot'])}"] = np.asarray(x)
        ops[eb] = d.tb.string(d.tb.events["op"][eb])
    return arrays, ops


def specs(d, sources, folder, env_b, argv_b, script, level):
    """([(RunSpec, source rank)], notes): one run per torch source of MECHANISMS."""
    out, notes = [], []
    for src in sources:
        if src.mechanism not in MECHANISMS or src.event_a < 0 or \
                int(d.ta.events["framework"][src.event_a]) != schema.FW_TORCH:
            continue
        arrays, ops = _values(d, _members(d, src))
        if arrays is None:
            notes.append(f"source {src.rank} ({src.mechanism}) not measured: {ops}")
            continue
        if not arrays:
            continue
        path = os.path.join(folder, f"substitute{src.rank}.npz")
        np.savez(path, ops=np.array(json.dumps({str(k): v for k, v in ops.items()})),
                 **arrays)
        spec = _runs.RunSpec(f"b with a's values at source {src.rank} ({src.mechanism})", [])
        spec.trace = os.path.join(folder, f"substitute{src.rank}.h5")
        spec.words = _runs.env_words(env_b) + [f"TRACEDIFF_SUBSTITUTE={path}"] + [
            sys.executable, "-m", "tracediff", "record", "--level", level, "-o", spec.trace,
            script, *argv_b[1:]]
        out.append((spec, src.rank))
    return out, notes


__all__ = ["specs", "MECHANISMS"]
