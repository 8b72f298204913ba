"""Build small synthetic traces with the real TraceWriter (unit tests of the differ)."""

import numpy as np

from tracediff.trace import schema
from tracediff.trace.manifest import base_manifest
from tracediff.trace.writer import TraceWriter


def manifest(**over):
    m = base_manifest()
    m["script"] = {"name": "synthetic.py", "sha256": "0" * 64, "path": "/x/synthetic.py"}
    for k, v in over.items():
        m[k] = v
    return m


def write(path, events, man=None, complete=True, source_dir=None):
    """events: list of dicts with keys kind, op, outs (list of arrays or (array, name)),
    ins ([(slot, producer, producer_slot)]), in_values ([array or (array, name)]),
    name_stack, source, call, parent, step, origin, framework, phase, node, uninit (slots).
    `source_dir`: record the lines of the sources (relative to it) as a recording does."""
    w = TraceWriter(path, man or manifest())
    if source_dir is not None:
        from tracediff.trace.sources import SourceRecorder

        w.source_lines = SourceRecorder(lambda: str(source_dir))
    for e in events:
        kind = e.get("kind", schema.KIND_OP)
        fw = e.get("framework", schema.FW_TORCH if kind == schema.KIND_OP else schema.FW_JAX)
        origin = e.get("origin", {schema.KIND_CALL: schema.ORIGIN_COMPILED,
                                  schema.KIND_EQN: schema.ORIGIN_REPLAY,
                                  schema.KIND_OPTIM: schema.ORIGIN_SNAPSHOT}.get(kind, schema.ORIGIN_EAGER))
        eid = w.add_event(framework=fw, kind=kind, op=e["op"], phase=e.get("phase", schema.PHASE_FWD),
                          origin=origin, name_stack=e.get("name_stack"), source=e.get("source"),
                          node=e.get("node"), call=e.get("call", -1), parent=e.get("parent", -1),
                          step=e.get("step", 0))
        for slot, v in enumerate(e.get("outs", [])):
            arr, name = v if isinstance(v, tuple) else (v, None)
            flags = schema.VFLAG_UNINIT if slot in e.get("uninit", ()) else 0
            w.add_value(eid, slot, np.asarray(arr), name=name, flags=flags)
        for slot, v in enumerate(e.get("in_values", [])):
            arr, name = v if isinstance(v, tuple) else (v, None)
            w.add_value(eid, slot, np.asarray(arr), role=schema.ROLE_IN, name=name)
        for slot, p, ps in e.get("ins", []):
            w.add_input(eid, slot, p, ps)
    if complete:
        w.close(end={"status": "ok", "exit_code": 0})
    else:
        w.flush()
        w._f.close()
    return path


def mlp_events(x, w1, scale=1.0, *, perturb=None, extra_at=None, steps=1):
    """A small torch-like op chain: input, mm, tanh, sum, optim snapshot per step."""
    evs = []
    for step in range(steps):
        base = len(evs)
        h = x @ w1
        if perturb == ("mm", step):
            h = h.copy()
            h.flat[0] = np.nextafter(h.flat[0], np.float32(np.inf))
        t = np.tanh(h) * scale
        evs.append(dict(kind=schema.KIND_INPUT, op="input", outs=[x], step=step,
                        framework=schema.FW_TORCH))
        evs.append(dict(op="aten::mm", outs=[h], ins=[(0, base, 0), (1, -2, 0)], name_stack="fc",
                        source="train.py:10", step=step))
        if extra_at == step:
            evs.append(dict(op="aten::view", outs=[h], ins=[(0, base + 1, 0)], step=step))
        k = len(evs)
        evs.append(dict(op="aten::tanh", outs=[t], ins=[(0, base + 1, 0)], name_stack="act",
                        source="train.py:11", step=step))
        evs.append(dict(op="aten::sum", outs=[np.asarray(t.sum(), np.float32)], ins=[(0, k, 0)],
                        source="train.py:12", step=step))
        evs.append(dict(kind=schema.KIND_OPTIM, op="optimizer.step", step=step + 1,
                        outs=[(w1, "params/fc.weight"), (w1 * 0, "grads/fc.weight")]))
    return evs
