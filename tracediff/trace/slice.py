"""A trace cut down to what explains one event, small enough to attach to a bug report.

Issue trackers take 10-25 MB; a few training steps of a small transformer record ~90 MB.
`tracediff slice` keeps the event, the events within N dataflow hops of it (its inputs'
producers and their producers, its consumers and theirs), the enclosing calls of those,
their values and the recorded source lines, and the manifest (with a "slice" entry saying
what was cut). The result is an ordinary trace: `locate`, `explain`, `repro`, `info`,
`show` and `report` take it as they take the original.
"""

import json
import os

import numpy as np

from ..errors import TraceError
from . import schema
from .blob import ValueReader
from .reader import Trace
from .sources import split_site
from .writer import write_finished

_EVENT_STRINGS = ("op", "params", "name_stack", "source", "node")
_VALUE_STRINGS = ("dtype", "storage", "shape", "name")
_SOURCE_STRINGS = ("source", "lines", "sha256")
_SHARD_STRINGS = ("device", "index", "shape")


def neighbourhood(t, around, hops):
    """Sorted event ids: `around`, every event within `hops` dataflow hops of it either
    way, and the enclosing calls / parents of all of those. Breadth-first from `around`
    over the inputs table sorted once each way: each hop visits only the events the last
    one added, and the search stops when a hop adds none, so a huge `hops` costs no more
    than the whole trace."""
    ev, pr = t.inputs["event"].astype(np.int64), t.inputs["producer"].astype(np.int64)
    ok = (pr >= 0) & (pr < len(t)) & (ev >= 0) & (ev < len(t))
    ev, pr = ev[ok], pr[ok]
    keep = {int(around)}
    for src, dst in ((ev, pr), (pr, ev)):      # back to producers, then on to consumers
        order = np.argsort(src, kind="stable")
        src, dst = src[order], dst[order]
        seen = np.zeros(len(t), bool)
        seen[around] = True
        frontier = np.array([around], np.int64)
        for _ in range(max(0, int(hops))):
            lo, hi = np.searchsorted(src, frontier), np.searchsorted(src, frontier, "right")
            count = hi - lo
            if not count.sum():
                break
            starts = np.repeat(lo - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
            reached = np.unique(dst[starts + np.arange(int(count.sum()))])
            frontier = reached[~seen[reached]]
            if not len(frontier):
                break
            seen[frontier] = True
        keep.update(np.flatnonzero(seen).tolist())
    todo = list(keep)
    while todo:                            # the calls and parents they sit in
        e = t.events[todo.pop()]
        for up in (int(e["call"]), int(e["parent"])):
            if 0 <= up < len(t) and up not in keep:
                keep.add(up)
                todo.append(up)
    return np.array(sorted(keep), np.int64)


def slice_trace(t, around, out, hops=2, replace=False):
    """Write the slice of open trace `t` around event `around` to `out`; returns
    {"events", "values", "bytes", "kept": [original event ids]}."""
    keep = neighbourhood(t, around, hops)
    new_id = np.full(len(t), -1, np.int64)
    new_id[keep] = np.arange(len(keep))

    def remap(ids):
        ids = ids.astype(np.int64)
        inside = (ids >= 0) & (ids < len(t))
        return np.where(inside, new_id[np.clip(ids, 0, max(len(t) - 1, 0))], ids)

    events = t.events[keep].copy()
    events["call"] = np.where(events["call"] >= 0, remap(events["call"]), events["call"])
    events["parent"] = np.where(events["parent"] >= 0, remap(events["parent"]), events["parent"])

    rows = np.flatnonzero(np.isin(t.values["event"], keep))
    vals = t.values[rows].copy()
    vals["event"] = new_id[vals["event"].astype(np.int64)]
    stored = vals["offset"] >= 0
    offsets, lengths = vals["offset"][stored], vals["nbytes"][stored]
    blob = ValueReader(t).gather(offsets.astype(np.int64), lengths.astype(np.int64),
                                 vals["hash"][stored]) \
        if stored.any() else np.zeros(0, "u1")
    new_off = np.full(len(vals), -1, np.int64)
    new_off[stored] = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]) \
        if stored.any() else []
    vals["offset"] = new_off

    inputs = t.inputs[np.isin(t.inputs["event"], keep)].copy()
    inputs["event"] = new_id[inputs["event"].astype(np.int64)]
    prod = inputs["producer"].astype(np.int64)
    kept_prod = remap(prod)
    # a producer outside the slice becomes "produced outside what was recorded"
    inputs["producer"] = np.where(prod >= 0, np.where(kept_prod >= 0, kept_prod,
                                                     schema.PRODUCER_UNKNOWN), prod)

    row_id = np.full(len(t.values), -1, np.int64)
    row_id[rows] = np.arange(len(rows))
    stats = t.stats_rows[(t.stats_rows["value"] >= 0) & (t.stats_rows["value"] < len(t.values))]
    stats = stats[row_id[stats["value"].astype(np.int64)] >= 0].copy()
    stats["value"] = row_id[stats["value"].astype(np.int64)]

    # the lines of the kept sources, and of the library line of each "LIB ← USER" one
    kept = set(np.unique(events["source"]).tolist())
    libs = {split_site(t.string(i))[1] for i in kept if i >= 0} - {""}
    kept |= {i for i, text in enumerate(t.strings) if text in libs}
    sources = t.source_rows[np.isin(t.source_rows["source"], sorted(kept))].copy()
    # per-device rows of kept events; a shard's own bytes are not carried (its hash is)
    devices = t.device_rows[np.isin(t.device_rows["event"], keep)].copy()
    devices["event"] = new_id[devices["event"].astype(np.int64)]
    shards = t.shard_rows[np.isin(t.shard_rows["event"], keep)].copy()
    shards["event"] = new_id[shards["event"].astype(np.int64)]
    placements = t.placement_rows[np.isin(t.placement_rows["event"], keep)].copy()
    placements["event"] = new_id[placements["event"].astype(np.int64)]
    settings = t.optim_setting_rows[np.isin(t.optim_setting_rows["event"], keep)].copy()
    settings["event"] = new_id[settings["event"].astype(np.int64)]
    own = shards["offset"] >= 0
    shards["flags"][own] |= schema.SHARD_DIGEST
    shards["offset"][own], shards["nbytes"][own] = -1, 0

    # strings: only those the slice refers to, renumbered
    refs = [events[c] for c in _EVENT_STRINGS] + [vals[c] for c in _VALUE_STRINGS] + \
        [sources[c] for c in _SOURCE_STRINGS] + [devices["device"]] + \
        [shards[c] for c in _SHARD_STRINGS] + [placements[c] for c in schema.PLACEMENT_STRINGS] + \
        [settings[c] for c in schema.OPTIM_SETTING_STRINGS]
    used = np.unique(np.concatenate([r.astype(np.int64) for r in refs])) if refs else []
    used = used[used >= 0]
    strings = [t.string(i) for i in used.tolist()]

    def restring(col):
        col = col.astype(np.int64)
        return np.where(col >= 0, np.searchsorted(used, col), -1)

    for table, cols in ((events, _EVENT_STRINGS), (vals, _VALUE_STRINGS),
                        (sources, _SOURCE_STRINGS), (devices, ("device",)),
                        (shards, _SHARD_STRINGS), (placements, schema.PLACEMENT_STRINGS),
                        (settings, schema.OPTIM_SETTING_STRINGS)):
        for c in cols:
            table[c] = restring(table[c])

    manifest = dict(t.manifest)
    original = t.event(around)
    manifest["slice"] = {
        "around": int(around), "around_new": int(new_id[around]), "hops": int(hops),
        "op": original["op"], "source": original["source"], "step": original["step"],
        "events": int(len(keep)), "of_events": int(len(t)),
        "kept": keep.tolist() if len(keep) <= 10_000 else None,
        "note": (f"a slice of {len(t)} events: event {around} ({original['op']}) and the "
                 f"events within {hops} dataflow hops of it; other events are not in it"),
    }
    attrs = {"format": schema.FORMAT_NAME, "schema_version": schema.SCHEMA_VERSION,
             "complete": bool(t.complete)}
    write_finished(out, {"events": events, "values": vals, "inputs": inputs, "stats": stats,
                         "sources": sources, "devices": devices, "shards": shards,
                         "placements": placements, "optim_settings": settings,
                         "blob": blob, "strings": strings},
                   json.dumps(manifest, sort_keys=True, default=str), attrs, replace=replace)
    return {"events": int(len(keep)), "values": int(len(vals)), "bytes": int(len(blob)),
            "kept": keep.tolist(), "around": int(new_id[around])}


def write_slice(path, around, out, hops=2, force=False):
    """`tracediff slice`: open PATH, check EVENT and OUT, write the slice; returns the
    summary of `slice_trace` plus the sizes before and after."""
    if hops < 0:
        raise TraceError(f"--hops {hops}: give a number of dataflow hops, 0 or more")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise TraceError(f"cannot write {out}: folder {folder} does not exist")
    if os.path.lexists(out) and not force:
        raise TraceError(f"{out} exists; give another -o or --force to replace it")
    if os.path.abspath(out) == os.path.abspath(path):
        raise TraceError(f"{out} is the trace being sliced; give another -o")
    with Trace(path) as t:
        if not 0 <= around < len(t):
            raise TraceError(f"{path}: no event {around} (the trace has {len(t)} events: "
                             f"0..{len(t) - 1})")
        try:
            info = slice_trace(t, around, out, hops=hops, replace=force)
        except FileExistsError:
            raise TraceError(f"{out} exists; give another -o or --force to replace it") from None
        except OSError as exc:
            raise TraceError(f"cannot write {out}: {exc.strerror or exc}") from None
        info["op"] = t.event(around)["op"]
        info["of_events"] = len(t)
    info["size"], info["of_size"] = os.path.getsize(out), os.path.getsize(path)
    return info
