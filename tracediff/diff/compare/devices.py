"""Where, among devices, two runs' values differ: per-device copies of a global value
(`Trace.device_values`) compared by digest, summed up as one line for the reports
("differs on cpu:3 only (shard 4 of 8)")."""

import numpy as np

from ...trace import schema
from ..result import DeviceDiff
from .levels import same_hash_function


def spread(ta, tb, ea, eb, max_rows=64):
    """([DeviceDiff], note) for paired events `ea`/`eb`: every per-device copy of their
    output values, whether it differs from b's copy on the same device, shard and replica,
    and a one-line summary; ([], "") when the values are not recorded per device."""
    if not (ta.has_devices() and tb.has_devices()) or not same_hash_function(ta, tb):
        return [], ""   # (digests of two hash functions say nothing about each other)
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
        if not summary and any(d.differs for d in diffs) and _process_local(ta, ea, slot):
            summary = _local_summary(diffs)
        elif not summary and any(d.differs for d in diffs) and len(da) > 1:
            summary = _summary(diffs, shards)
        rows.extend(diffs)
    return rows[:max_rows], summary


def _process_local(t, e, slot):
    """Is output `slot` of event e a global value whose bytes this trace does not hold,
    only its own devices' shards (a jax.Array spread over several processes)?"""
    rows = t.value_rows(int(e), schema.ROLE_OUT)
    rows = rows[rows["slot"] == slot]
    return bool(len(rows)) and rows[0]["offset"] < 0 and bool(
        rows[0]["flags"] & schema.VFLAG_NOT_STORED) and not (rows[0]["flags"] & schema.VFLAG_STATS)


def _local_summary(diffs):
    bad = [d for d in diffs if d.differs]
    shown = ", ".join(f"{d.shard or 'whole'} on {d.device}" for d in bad[:4])
    return (f"differs in this process's own shard{'s' if len(bad) > 1 else ''} ({shown}; "
            f"{len(bad)} of the {len(diffs)} it holds); the rest of the global value lives "
            f"on other processes, each recording its own")


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


def replica_only(ta, tb, a2b):
    """The first paired event (in a's order) one of whose per-device copies differs from
    b's although the two global values are bitwise equal (a replica that departed on one
    device: `locate` compares global values and would not see it), as a warning line;
    None when there is none. Vectorised over the shards tables."""
    sa, sb = ta.shard_rows, tb.shard_rows
    if not len(sa) or not len(sb) or not same_hash_function(ta, tb):
        return None
    ea = sa["event"].astype(np.int64)
    eb = a2b[np.clip(ea, 0, len(a2b) - 1)]
    paired = (ea < len(a2b)) & (eb >= 0)
    if not paired.any():
        return None
    key_b = {}
    for r, ev in zip(sb, sb["event"].tolist()):
        key_b[(ev, int(r["slot"]), int(r["role"]), tb.string(r["device"]),
               tb.string(r["index"]), int(r["replica"]))] = int(r["hash"])
    order = np.argsort(ea, kind="stable")
    for i in order[paired[order]].tolist():
        r = sa[i]
        k = (int(eb[i]), int(r["slot"]), int(r["role"]), ta.string(r["device"]),
             ta.string(r["index"]), int(r["replica"]))
        h = key_b.get(k)
        if h is None or h == int(r["hash"]):
            continue
        e = int(ea[i])
        if not _global_equal(ta, tb, e, int(eb[i]), int(r["slot"]), int(r["role"])):
            continue   # the global values differ too: locate reports that
        ev = ta.event(e)
        what = f"shard {k[4]}" if k[4] else f"replica {k[5]}"
        return (f"event #{e} ({ev['op']}, step {ev['step']}): its global value matches, but "
                f"its copy on {k[3]} ({what}) differs from b's: a device departed there")
    return None


def _global_equal(ta, tb, ea, eb, slot, role):
    ra = ta.value_rows(ea)
    rb = tb.value_rows(eb)
    ra = ra[(ra["slot"] == slot) & (ra["role"] == role)]
    rb = rb[(rb["slot"] == slot) & (rb["role"] == role)]
    return bool(len(ra) and len(rb) and int(ra[0]["hash"]) == int(rb[0]["hash"]) and
                int(ra[0]["hash"]) != 0)
