"""`tracediff info` and `tracediff show`: a trace's summary and one event in detail.

Printed as rich markup: every value from the trace (op names, name stacks, sources,
manifest fields) goes through `untrusted.markup` (table cells: plain `Text` of
`untrusted.printable`), so it is shown as typed and no escape sequence or markup from a
trace reaches the terminal.
"""

import collections

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..trace import schema
from ..trace.manifest import capture_losses
from ..trace.sources import LIB_SEP
from ..trace.values import as_float64
from ..untrusted import markup, printable


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
    if len(t.shard_rows):   # per-device copies of the outputs (capture/jax/devices.py)
        per = []
        for slot in sorted({int(r["slot"]) for r in t.value_rows(eid, schema.ROLE_OUT)}):
            for dv in t.device_values(eid, slot):
                if not dv.shard and dv.device == d.get("device"):
                    continue   # the event's own value, shown above
                per.append({"slot": slot, "device": dv.device, "shard": dv.shard,
                            "replica": dv.replica, "digest": dv.digest})
        if per:
            d["per_device"] = per[:MAX_PER_DEVICE]
            d["per_device_total"] = len(per)
    return d, arrays


MAX_PER_DEVICE = 64


def print_summary(s, console=None):
    console = console or Console(emoji=False, highlight=False)
    m = s["manifest"]
    pk = m.get("packages") or {}
    end = m.get("end") or {}
    script = m.get("script") or {}
    console.print(f"[bold]{markup(s['path'])}[/]  schema v{s['schema_version']}"
                  f"{'' if s['complete'] else '  [red]TRUNCATED (recording did not finish)[/]'}")
    console.print(f"script: {markup(script.get('name', '?'))}  sha256 "
                  f"{markup(str(script.get('sha256', '?'))[:12])}  ended: "
                  f"{markup(end.get('status', '?'))} (exit {markup(end.get('exit_code', '?'))})"
                  f"{_handled(end)}")
    console.print(f"recorded {markup(m.get('created', '?'))} on {markup(m.get('hostname', '?'))}: "
                  f"{markup((m.get('os') or {}).get('platform', '?'))}, "
                  f"{markup((m.get('cpu') or {}).get('model', '?'))}")
    console.print("packages: " + ", ".join(markup(f"{k} {v}") for k, v in sorted(pk.items())))
    console.print(f"recording: {markup(m.get('recording') or {})}")
    dist = m.get("distributed")
    if isinstance(dist, dict):   # one process of a multi-process run
        extra = ", ".join(f"{k} {markup(dist[k])}" for k in
                          ("local_rank", "launcher", "backend", "process_index", "process_count")
                          if dist.get(k) is not None)
        console.print(f"rank {markup(dist.get('rank', '?'))} of {markup(dist.get('world_size', '?'))}"
                      f"{' (' + extra + ')' if extra else ''}")
    cut = m.get("slice")
    if isinstance(cut, dict):
        console.print(f"[yellow]a slice[/] ({markup(cut.get('events', '?'))} of "
                      f"{markup(cut.get('of_events', '?'))} events): event "
                      f"{markup(cut.get('around', '?'))} of the original "
                      f"({markup(cut.get('op', '?'))}, now {markup(cut.get('around_new', '?'))}) "
                      f"and the events within {markup(cut.get('hops', '?'))} dataflow hops of it")
    for line in capture_losses(m.get("frameworks")):   # never a silent partial trace
        console.print(f"[bold red]capture:[/] {markup(line)}")
    console.print(f"events: {s['events']}  values: {s['values']}  bytes: {s['bytes']:,}  "
                  f"optimizer steps: {s['optimizer_steps']}  kinds: {markup(s['kinds'])}")
    table = Table(title="operations (most frequent first)")
    for col in ("framework", "op", "count"):
        table.add_column(col, justify="right" if col == "count" else "left")
    for row in s["operations"][:40]:
        table.add_row(Text(printable(row["framework"])), Text(printable(row["op"])),
                      str(row["count"]))
    console.print(table)
    if len(s["operations"]) > 40:
        console.print(f"... and {len(s['operations']) - 40} more (--json for all)")


def print_lines(lines, console=None):
    """Lines of rich markup (their trace strings already escaped), one each, never
    wrapped (they are pasted into bug reports)."""
    console = console or Console(emoji=False, highlight=False, soft_wrap=True)
    for line in lines:
        console.print(line)


def print_event(d, console=None):
    console = console or Console(emoji=False, highlight=False)
    console.print(f"[bold]event {d['index']}[/]: {markup(d['framework'])} {markup(d['kind'])} "
                  f"[bold]{markup(d['op'])}[/] ({markup(d['phase'])}, values from "
                  f"{markup(d['origin'] or '-')})")
    for key in ("name_stack", "source", "node", "params"):
        if d[key]:   # source: "LIB ← USER" when the op ran inside library code
            text = f"{d['lib_source']}{LIB_SEP}{d[key]}" if key == "source" and \
                d.get("lib_source") else d[key]
            console.print(f"  {key}: {markup(text)}")
    if d.get("device"):
        console.print(f"  device: {markup(d['device'])}")
    console.print(f"  step {d['step']}  call {d['call']}  parent {d['parent']}  iter {d['iter']}")
    for i in d["inputs"]:
        console.print(f"  input {i['slot']} <- event {i['producer']}[{i['producer_slot']}] "
                      f"{markup(i['producer_op'] or '')}")
    for v in d["values"]:
        head = (f"  {v['role']} {v['slot']}{' ' + markup(v['name']) if v['name'] else ''}: "
                f"{markup(str(v['dtype']) + str(v['shape']))}")
        if v["uninitialized"]:
            head += " (uninitialised memory, not compared)"
        elif not v["stored"]:
            head += " (not stored)"
        console.print(head + f" hash {markup(v['hash'])}")
        stats = {k: v[k] for k in ("min", "max", "mean", "nan", "inf") if k in v}
        if stats:
            console.print(f"    {markup(stats)}")
        if "values" in v:
            console.print(f"    {markup(v['values'])}")
    per = d.get("per_device") or []
    if per:
        console.print(f"  per device ({d.get('per_device_total', len(per))} copies):")
    for p in per:
        console.print(f"    output {p['slot']} on {markup(p['device'])}  shard "
                      f"{markup(p['shard'] or 'whole')}  replica {p['replica']}  "
                      f"hash {markup(p['digest'] or '-')}")


def _handled(end):
    """", after SIGTERM taken by the script's own handler" where the trace says so."""
    taken = end.get("signals_handled_by_script")
    if not isinstance(taken, list) or not taken:
        return ""
    names = ", ".join(markup(str(x)[:20]) for x in taken[:6])
    return f", after {names} taken by the script's own handler"
