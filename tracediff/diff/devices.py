"""Where, among devices, two runs' values differ: per-device copies of a global value
(`Trace.device_values`) compared by digest, summed up as one line for the reports
("differs on cpu:3 only (shard 4 of 8)")."""

from ..trace import schema
from .result import DeviceDiff


def spread(ta, tb, ea, eb, max_rows=64):
    """([DeviceDiff], note) for paired events `ea`/`eb`: every per-device copy of their
    output values, whether it differs from b's copy on the same device, shard and replica,
    and a one-line summary; ([], "") when the values are not recorded per device."""
    if not (ta.has_devices() and tb.has_devices()):
        return [], ""
    rows, summary = [], ""
    slots = sorted({int(r["slot"]) for r in ta.value_rows(int(ea), schema.ROLE_OUT)})
    for slot in slots:
        da, db = ta.device_values(ea, slot), tb.device_values(eb, slot)
        if not da or not db:
            continue
        by_key = {(v.device, v.shard, v.replica): v for v in db}
        shards = []
        for v in da:
            if v.shard not in shards:
                shards.append(v.shard)
        diffs = []
        for v in da:
            w = by_key.get((v.device, v.shard, v.replica))
            differs = w is None or not v.digest or w.digest != v.digest
            diffs.append(DeviceDiff(slot=slot, device=v.device, shard=v.shard,
                                    replica=v.replica, differs=differs))
        if not summary and any(d.differs for d in diffs) and len(da) > 1:
            summary = _summary(diffs, shards)
        rows.extend(diffs)
    return rows[:max_rows], summary


def _summary(diffs, shards):
    bad = [d for d in diffs if d.differs]
    devices = list(dict.fromkeys(d.device for d in diffs))
    bad_devices = list(dict.fromkeys(d.device for d in bad))
    if len(bad_devices) == len(devices):
        return f"differs on all {len(devices)} devices"
    if len(bad_devices) == 1:
        d = bad[0]
        if len(shards) > 1:
            where = f"shard {shards.index(d.shard)} of {len(shards)}"
        else:
            where = f"replica {d.replica} of {len(diffs)}"
        return f"differs on {d.device} only ({where})"
    shown = ", ".join(bad_devices[:8]) + (" ..." if len(bad_devices) > 8 else "")
    return f"differs on {shown} ({len(bad_devices)} of {len(devices)} devices)"
