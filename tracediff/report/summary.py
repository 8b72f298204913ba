"""`tracediff info` and `tracediff show`: a trace's summary and one event in detail."""

import collections

import numpy as np
from rich.console import Console
from rich.table import Table

from ..trace import schema
from ..trace.values import as_float64


def trace_summary(t):
    """Plain dict: manifest, counts, per-operation summary."""
    kinds = collections.Counter(schema.KIND_NAMES.get(int(k), "?") for k in t.events["kind"])
    ops = collections.Counter()
    for fw, op in zip(t.events["framework"], t.events["op"]):
        ops[(schema.FW_NAMES.get(int(fw), "?"), t.string(op))] += 1
    steps = int(t.events["step"].max()) if len(t) else 0
    return {
        "path": t.path, "schema_version": t.schema_version, "complete": t.complete,
        "events": len(t), "values": int(len(t.values)),
        "bytes": int(t.values["nbytes"].sum()) if len(t.values) else 0,
        "optimizer_steps": int(kinds.get("optim", 0)), "last_step": steps,
        "kinds": dict(kinds),
        "operations": [{"framework": fw, "op": op, "count": n} for (fw, op), n in ops.most_common()],
        "manifest": t.manifest,
    }


def _value_summary(arr):
    x = as_float64(arr)
    out = {}
    if x is not None and x.size and not np.iscomplexobj(x):
        finite = x[np.isfinite(x)]
        out = {"min": float(finite.min()) if finite.size else None,
               "max": float(finite.max()) if finite.size else None,
               "mean": float(finite.mean()) if finite.size else None,
               "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum())}
    if arr.size <= 16:
        out["values"] = np.asarray(arr).tolist() if arr.dtype.kind in "biufc" else str(arr)
    return out


def event_detail(t, eid):
    """(dict describing event `eid`, list of its stored output arrays)."""
    d = t.event(eid)
    d["inputs"] = []
    for row in t.input_rows(eid):
        p = int(row["producer"])
        desc = {schema.PRODUCER_LITERAL: "literal", schema.PRODUCER_CONST: "constant",
                schema.PRODUCER_UNKNOWN: "unknown"}.get(p)
        d["inputs"].append({"slot": int(row["slot"]), "producer": p,
                            "producer_slot": int(row["producer_slot"]),
                            "producer_op": desc or t.string(t.events[p]["op"]) if 0 <= p < len(t) else desc})
    arrays, vals = [], []
    for row in t.value_rows(eid):
        meta = t.value_meta(row)
        meta.update(slot=int(row["slot"]), role="input" if row["role"] == schema.ROLE_IN else "output")
        arr = t.read_value(row)
        if arr is not None:
            meta.update(_value_summary(arr))
            if row["role"] == schema.ROLE_OUT:
                arrays.append(arr)
        vals.append(meta)
    d["values"] = vals
    return d, arrays


def print_summary(s, console=None):
    console = console or Console()
    m = s["manifest"]
    pk = m.get("packages", {})
    console.print(f"[bold]{s['path']}[/]  schema v{s['schema_version']}"
                  f"{'' if s['complete'] else '  [red]TRUNCATED (recording did not finish)[/]'}")
    script = m.get("script", {})
    console.print(f"script: {script.get('name', '?')}  sha256 {script.get('sha256', '?')[:12]}  "
                  f"ended: {m.get('end', {}).get('status', '?')} (exit {m.get('end', {}).get('exit_code', '?')})")
    console.print(f"recorded {m.get('created', '?')} on {m.get('hostname', '?')}: "
                  f"{m.get('os', {}).get('platform', '?')}, {m.get('cpu', {}).get('model', '?')}")
    console.print("packages: " + ", ".join(f"{k} {v}" for k, v in sorted(pk.items())))
    console.print(f"recording: {m.get('recording', {})}")
    console.print(f"events: {s['events']}  values: {s['values']}  bytes: {s['bytes']:,}  "
                  f"optimizer steps: {s['optimizer_steps']}  kinds: {s['kinds']}")
    table = Table(title="operations (most frequent first)")
    for col in ("framework", "op", "count"):
        table.add_column(col, justify="right" if col == "count" else "left")
    for row in s["operations"][:40]:
        table.add_row(row["framework"], row["op"], str(row["count"]))
    console.print(table)
    if len(s["operations"]) > 40:
        console.print(f"... and {len(s['operations']) - 40} more (--json for all)")


def print_event(d, console=None):
    console = console or Console()
    console.print(f"[bold]event {d['index']}[/]: {d['framework']} {d['kind']} [bold]{d['op']}[/] "
                  f"({d['phase']}, values from {d['origin'] or '-'})")
    for key in ("name_stack", "source", "node", "params"):
        if d[key]:
            console.print(f"  {key}: {d[key]}")
    console.print(f"  step {d['step']}  call {d['call']}  parent {d['parent']}  iter {d['iter']}")
    for i in d["inputs"]:
        console.print(f"  input {i['slot']} <- event {i['producer']}[{i['producer_slot']}] {i['producer_op'] or ''}")
    for v in d["values"]:
        head = f"  {v['role']} {v['slot']}{' ' + v['name'] if v['name'] else ''}: {v['dtype']}{v['shape']}"
        if v["uninitialized"]:
            head += " (uninitialised memory, not compared)"
        elif not v["stored"]:
            head += " (not stored)"
        console.print(head + f" hash {v['hash']}")
        stats = {k: v[k] for k in ("min", "max", "mean", "nan", "inf") if k in v}
        if stats:
            console.print(f"    {stats}")
        if "values" in v:
            console.print(f"    {v['values']}")
