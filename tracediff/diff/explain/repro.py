"""`tracediff repro TRACE EVENT -o DIR`: a standalone reproducer of one recorded op.

Writes DIR/inputs.npz (the op's recorded inputs `in0..`, and its recorded outputs
`recorded0..`, saved with allow_pickle=False; bfloat16 as its raw uint16 bits) and
DIR/repro.py, a script that needs only numpy and the op's framework: it runs the op
alone with those inputs, prints each output, its sha256 and whether it equals the
output recorded in the trace. It is what to attach to an upstream bug report: run it
on both machines and compare the hashes.

The call is rebuilt as for `explain/replay/` (allow-listed ops only, parameters from the
params summary); an op that cannot be rebuilt gives a clear error, not a script.

The trace is untrusted, and the user runs the script: nothing from the trace reaches its
code except allow-listed identifiers (op, overload, parameter and constant names) and
`repr` literals; the op, source, name stack, hostname and file name are shown on comment
lines made `printable`. Existing files in DIR (or links there) are never overwritten
unless `force`, and never written through.
"""

import os
import secrets

import numpy as np

from ... import shell
from ..._version import __version__
from ...errors import TraceError
from ...untrusted import printable, py_str
from ...trace import schema
from ..align import sequence as _align
from .replay.calls import build_call, recorded_output_size
from .replay.params import CannotReplay


def _raw(x):
    x = np.asarray(x)
    x = np.ascontiguousarray(x).reshape(x.shape)   # keeps 0-d values 0-d
    if x.dtype.name == "bfloat16":
        return x.view(np.uint16)
    if x.dtype.kind not in "biufc":
        raise TraceError(f"cannot write a {x.dtype} value to .npz")
    return x


# The docstring is fixed text. What the trace says about the op (strings chosen by whoever
# recorded it) follows on comment lines made `printable` (one line each, control characters
# escaped), from line 9 on: a comment on line 1 or 2 could set the file's encoding.
HEADER = '''"""Standalone reproducer of one op, written by tracediff {version}.

Runs the op alone on this machine with the recorded inputs (inputs.npz) and prints each
output with its sha256; compare the hashes between machines. Needs numpy and {framework}.
Usage: python repro.py

The comments below are copied from the trace (control characters escaped).
"""
# op: {op} ({framework}), event {event} of {trace}
# recorded at: {source}, step {step}{name_stack}
# recorded on: {host}, {fw_version}

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
OP = {op}
print(f"{{OP}} on this machine ({{versions}}):")
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


FILES = ("inputs.npz", "repro.py")


def write_repro(trace_path, event, out_dir, force=False):
    """Write DIR/repro.py and DIR/inputs.npz for event `event` of a trace; returns a dict
    {script, npz, op, framework, n_inputs, call}. Raises TraceError when it cannot, and
    when either file exists already, unless `force` (see `_write_new`)."""
    from ...trace.reader import Trace
    from .verdict import trace_inputs
    from ...trace.blob import ValueReader

    with Trace(trace_path) as t:
        if not 0 <= event < len(t):
            raise TraceError(f"{trace_path}: no event {event} (the trace has events 0 to "
                             f"{len(t) - 1})")
        e = t.event(event)
        if e["kind"] not in ("eqn", "eager", "op"):
            raise TraceError(f"event {event} is a {e['kind']} event ({printable(e['op'], 80)}), "
                             f"not a single op; pick an equation or op "
                             f"({shell.command('tracediff', 'show', trace_path, event)})")
        side = _align.prepare(t, _align.StringIds())
        reader = ValueReader(t)
        try:
            inputs = trace_inputs(t, side, reader, event)
            call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                              recorded_output_size(t, event))
            call.check_size(inputs)   # the script would allocate what a replay would
            code = call.code()
        except CannotReplay as exc:
            raise TraceError(f"cannot write a reproducer for {printable(e['op'], 80)} "
                             f"(event {event}): {printable(exc)}") from None
        rows = t.value_rows(event, schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        outputs = [reader.read(r) for r in rows]
        manifest = t.manifest
    fw = call.framework            # "torch" or "jax": build_call knows no other
    arrays = {f"in{i}": _raw(x) for i, x in enumerate(inputs)}
    for i, x in enumerate(outputs):
        if x is not None:
            arrays[f"recorded{i}"] = _raw(x)
    fw_info = (manifest.get("frameworks") or {}).get(fw)
    fw_version = fw_info.get("version", "?") if isinstance(fw_info, dict) else "?"
    ns = e["name_stack"]
    text = HEADER.format(version=__version__, framework=fw, event=event, step=e["step"],
                         op=printable(e["op"]), trace=printable(os.path.basename(str(trace_path))),
                         source=printable(e["source"] or "-"),
                         name_stack=f", name stack {printable(ns)}" if ns else "",
                         host=printable(manifest.get("hostname") or "?"),
                         fw_version=printable(f"{fw} {fw_version}"))
    text += BODY.format(in_dtypes=[np.asarray(x).dtype.name for x in inputs],
                        out_dtypes=[np.asarray(x).dtype.name if x is not None else None
                                    for x in outputs])
    text += (TORCH if fw == "torch" else JAX).format(call=code)
    text += TAIL.format(op=py_str(e["op"]))
    paths = _targets(out_dir, force)
    done = []
    try:
        _write_new(paths["inputs.npz"], lambda fh: np.savez(fh, **arrays), force)
        done.append(paths["inputs.npz"])
        _write_new(paths["repro.py"], lambda fh: fh.write(text.encode("utf-8")), force)
    except TraceError:
        if not force:
            for path in done:   # created by this call: do not leave half a reproducer
                _unlink(path)
        raise
    return {"script": paths["repro.py"], "npz": paths["inputs.npz"], "op": e["op"],
            "framework": fw, "n_inputs": len(inputs), "call": code}


def _targets(out_dir, force):
    """{name: path} of the files to write in `out_dir` (created if needed); refuses when
    one exists (a link too, even a dangling one) unless `force`."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise TraceError(f"{out_dir} exists and is not a folder (give -o a folder)")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot create folder {out_dir}: {exc.strerror or exc}") from None
    paths = {name: os.path.join(out_dir, name) for name in FILES}
    for path in paths.values():
        if not force and os.path.lexists(path):
            raise _exists(path)
    return paths


def _exists(path):
    return TraceError(f"{path} already exists; give --force to replace it (or another -o DIR)")


def _write_new(path, write, force):
    """Create `path` with `write(binary file)`, never through a link: O_CREAT|O_EXCL (which
    refuses an existing path, a link included) and O_NOFOLLOW. With `force` the file is
    written next to `path` under a temporary name and renamed over it (a rename replaces
    a link, it never writes where the link points). Write, flush and close errors are one
    TraceError; the partial file is removed."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp") if force else path
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:
        raise _exists(path) from None
    except OSError as exc:
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        if force:
            os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
