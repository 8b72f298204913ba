"""`tracediff repro TRACE EVENT -o DIR`: a standalone reproducer of one recorded op.

Writes DIR/inputs.npz (the op's recorded inputs `in0..`, and its recorded outputs
`recorded0..`, saved with allow_pickle=False; bfloat16 as its raw uint16 bits) and
DIR/repro.py, a script that needs only numpy and the op's framework: it runs the op
alone with those inputs, prints each output, its sha256 and whether it equals the
output recorded in the trace. It is what to attach to an upstream bug report: run it
on both machines and compare the hashes.

The call is rebuilt as for `replay.py` (allow-listed ops only, parameters from the
params summary); an op that cannot be rebuilt gives a clear error, not a script.
"""

import os

import numpy as np

from .. import __version__
from ..errors import TraceError
from ..trace import schema
from . import align as _align
from . import replay as _replay


def _raw(x):
    x = np.asarray(x)
    x = np.ascontiguousarray(x).reshape(x.shape)   # keeps 0-d values 0-d
    if x.dtype.name == "bfloat16":
        return x.view(np.uint16)
    if x.dtype.kind not in "biufc":
        raise TraceError(f"cannot write a {x.dtype} value to .npz")
    return x


HEADER = '''"""Standalone reproducer written by tracediff {version}.

op: {op} ({framework}), event {event} of {trace}
recorded at: {source}, step {step}{name_stack}
recorded on: {host}, {fw_version}

Runs the op alone on this machine with the recorded inputs (inputs.npz) and prints each
output with its sha256; compare the hashes between machines. Needs numpy and {framework}.
Usage: python repro.py
"""

import hashlib
import os
import sys

import numpy as np
'''

BODY = '''
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = np.load(os.path.join(HERE, "inputs.npz"), allow_pickle=False)
INPUT_DTYPES = {in_dtypes!r}
OUTPUT_DTYPES = {out_dtypes!r}


def _load(name, dtype):
    x = DATA[name]
    if dtype == "bfloat16":
        import ml_dtypes

        x = x.view(ml_dtypes.bfloat16)
    return x


arrays = [_load(f"in{{i}}", d) for i, d in enumerate(INPUT_DTYPES)]
'''

TORCH = '''
import torch  # noqa: E402


def _tensor(x):
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _numpy(t):
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


inputs = [_tensor(x) for x in arrays]
with torch.no_grad():
    out = {call}
outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
outs = [_numpy(o) for o in outs]
versions = f"torch {{torch.__version__}}, numpy {{np.__version__}}"
'''

JAX = '''
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # keep float64 inputs float64
from jax import lax  # noqa: E402,F401
from jax.extend.core import primitives  # noqa: E402

inputs = arrays
out = {call}
outs = [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]
versions = f"jax {{jax.__version__}}, numpy {{np.__version__}}"
'''

TAIL = '''
print(f"{op} on this machine ({{versions}}):")
same_all = True
for i, o in enumerate(outs):
    raw = np.ascontiguousarray(o).reshape(o.shape)
    digest = hashlib.sha256(raw.tobytes()).hexdigest()[:16]
    print(f"output {{i}}: {{o.dtype}}{{list(o.shape)}} sha256 {{digest}}")
    print(np.array2string(np.asarray(o, dtype=np.float64) if o.dtype.name == "bfloat16" else o,
                          precision=17, threshold=20))
    key = f"recorded{{i}}"
    if key in DATA.files:
        rec = _load(key, OUTPUT_DTYPES[i])
        same = rec.dtype == o.dtype and rec.shape == o.shape and rec.tobytes() == raw.tobytes()
        same_all &= same
        rdig = hashlib.sha256(np.ascontiguousarray(rec).tobytes()).hexdigest()[:16]
        print(f"  recorded in the trace: sha256 {{rdig}} -> "
              f"{{'identical' if same else 'DIFFERENT'}}")
sys.exit(0 if same_all else 1)
'''


def write_repro(trace_path, event, out_dir):
    """Write DIR/repro.py and DIR/inputs.npz for event `event` of a trace; returns a dict
    {script, npz, op, framework, n_inputs}. Raises TraceError when it cannot."""
    from ..trace.reader import Trace
    from .explain import trace_inputs
    from .locate import ValueReader

    with Trace(trace_path) as t:
        if not 0 <= event < len(t):
            raise TraceError(f"{trace_path}: no event {event} (the trace has events 0 to "
                             f"{len(t) - 1})")
        e = t.event(event)
        if e["kind"] not in ("eqn", "eager", "op"):
            raise TraceError(f"event {event} is a {e['kind']} event ({e['op']}), not a single "
                             f"op; pick an equation or op (tracediff show {trace_path} {event})")
        side = _align.prepare(t, _align.StringIds())
        reader = ValueReader(t)
        try:
            inputs = trace_inputs(t, side, reader, event)
            call = _replay.build_call(e["framework"], e["op"], e["params"], len(inputs),
                                      _replay.recorded_output_size(t, event))
            call.check_size(inputs)   # the script would allocate what a replay would
        except _replay.CannotReplay as exc:
            raise TraceError(f"cannot write a reproducer for {e['op']} (event {event}): {exc}") \
                from None
        rows = t.value_rows(event, schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        outputs = [reader.read(r) for r in rows]
        manifest = t.manifest
    os.makedirs(out_dir, exist_ok=True)
    arrays = {f"in{i}": _raw(x) for i, x in enumerate(inputs)}
    for i, x in enumerate(outputs):
        if x is not None:
            arrays[f"recorded{i}"] = _raw(x)
    npz = os.path.join(out_dir, "inputs.npz")
    np.savez(npz, **arrays)
    fw = e["framework"]
    fw_info = (manifest.get("frameworks") or {}).get(fw) or {}
    text = HEADER.format(version=__version__, op=e["op"], framework=fw, event=event,
                         trace=os.path.basename(str(trace_path)), source=e["source"] or "-",
                         step=e["step"],
                         name_stack=f", {e['name_stack']}" if e["name_stack"] else "",
                         host=manifest.get("hostname") or "?",
                         fw_version=f"{fw} {fw_info.get('version', '?')}")
    text += BODY.format(in_dtypes=[np.asarray(x).dtype.name for x in inputs],
                        out_dtypes=[np.asarray(x).dtype.name if x is not None else None
                                    for x in outputs])
    text += (TORCH if fw == "torch" else JAX).format(call=call.code())
    text += TAIL.format(op=e["op"])
    script = os.path.join(out_dir, "repro.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(text)
    return {"script": script, "npz": npz, "op": e["op"], "framework": fw,
            "n_inputs": len(inputs), "call": call.code()}
