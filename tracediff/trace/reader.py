"""Read a trace safely: plain h5py reads of numbers, strings and JSON; nothing executed.

Tables are loaded whole (a few dozen bytes per row); values are read lazily from the
byte arena, one slice each, after checking that the slice lies inside it.
"""

import json
import os

import h5py
import numpy as np

from ..errors import TraceError
from . import schema, values

MAX_MANIFEST_BYTES = 16 << 20


def _open(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file")
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory, not a trace file")
    if os.path.getsize(path) == 0:
        raise TraceError(f"{path}: empty file, not a trace")
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        with open(path, "rb") as fh:
            magic = fh.read(8)
        if magic != b"\x89HDF\r\n\x1a\n":
            raise TraceError(f"{path}: not an HDF5 file (is this a tracediff trace?)") from None
        raise TraceError(f"{path}: HDF5 file cannot be opened, it may be truncated or corrupt "
                         f"({str(exc).splitlines()[0][:120]})") from None


class Trace:
    """A recorded run: manifest, event/value/input tables, and lazy access to values."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = _open(self.path)
        try:
            self._load()
        except TraceError:
            self._f.close()
            raise
        except (KeyError, ValueError, TypeError, OSError, RuntimeError) as exc:
            self._f.close()
            raise TraceError(f"{self.path}: damaged trace ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None

    def _load(self):
        f = self._f
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode("utf-8", "replace")
        if fmt != schema.FORMAT_NAME:
            raise TraceError(f"{self.path}: an HDF5 file, but not a tracediff trace")
        version = int(f.attrs.get("schema_version", -1))
        if version > schema.SCHEMA_VERSION:
            raise TraceError(f"{self.path}: trace schema version {version} is newer than this "
                             f"tracediff reads ({schema.SCHEMA_VERSION}); upgrade tracediff")
        if version < 1:
            raise TraceError(f"{self.path}: invalid schema version {version}")
        self.schema_version = version
        self.complete = bool(f.attrs.get("complete", False))
        tables = {}
        for name, dt in schema.TABLES.items():
            if name in schema.OPTIONAL_TABLES and name not in f:
                tables[name] = np.zeros(0, dt)
                continue
            ds = f[name]
            if ds.dtype != dt:
                raise TraceError(f"{self.path}: table {name!r} has an unexpected layout")
            n = min(int(f.attrs.get(f"committed_{name}", 0)), ds.shape[0])
            tables[name] = ds[:n] if n else np.zeros(0, dt)
        self.events, self.values, self.inputs = tables["events"], tables["values"], tables["inputs"]
        self.stats_rows = tables["stats"]  # statistics of values stored as stats + hash only
        self._stats_index = None
        ds = f["strings"]
        n = min(int(f.attrs.get("committed_strings", 0)), ds.shape[0])
        raw = ds[:n] if n else []
        self.strings = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in raw]
        self.blob_size = min(int(f.attrs.get("committed_blob", 0)), f["blob"].shape[0])
        mds = f["manifest"]
        if mds.shape != () or (mds.dtype.kind not in "OS"):
            raise TraceError(f"{self.path}: manifest is not a JSON string")
        text = mds[()]
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if len(text) > MAX_MANIFEST_BYTES:
            raise TraceError(f"{self.path}: manifest is implausibly large")
        try:
            self.manifest = json.loads(text)
        except json.JSONDecodeError:
            raise TraceError(f"{self.path}: manifest is not valid JSON") from None
        if not isinstance(self.manifest, dict):
            raise TraceError(f"{self.path}: manifest is not a JSON object")
        # Rows whose events were never committed (writer killed) are dropped.
        n_ev = len(self.events)
        self.values = self.values[(self.values["event"] >= 0) & (self.values["event"] < n_ev)]
        self.inputs = self.inputs[(self.inputs["event"] >= 0) & (self.inputs["event"] < n_ev)]
        self._v_order = np.argsort(self.values["event"], kind="stable")
        self._v_sorted = self.values["event"][self._v_order]
        self._i_order = np.argsort(self.inputs["event"], kind="stable")
        self._i_sorted = self.inputs["event"][self._i_order]

    # -- strings and events -----------------------------------------------------------------
    @property
    def truncated(self):
        return not self.complete

    def string(self, idx):
        idx = int(idx)
        return self.strings[idx] if 0 <= idx < len(self.strings) else ""

    def __len__(self):
        return len(self.events)

    def event(self, eid):
        """One event as a plain dict with its strings resolved."""
        e = self.events[int(eid)]
        s = self.string
        return {
            "index": int(eid),
            "framework": schema.FW_NAMES.get(int(e["framework"]), "?"),
            "kind": schema.KIND_NAMES.get(int(e["kind"]), "?"),
            "phase": schema.PHASE_NAMES.get(int(e["phase"]), "?"),
            "origin": schema.ORIGIN_NAMES.get(int(e["origin"]), "?"),
            "op": s(e["op"]), "params": s(e["params"]), "name_stack": s(e["name_stack"]),
            "source": s(e["source"]), "node": s(e["node"]),
            "call": int(e["call"]), "parent": int(e["parent"]), "step": int(e["step"]),
            "iter": int(e["iter"]),
        }

    def events_table(self):
        """The events as a dict of equal-length numpy columns, strings resolved, for
        `pandas.DataFrame(t.events_table())` (pandas is not needed otherwise).

        Columns: index, framework, kind, phase, origin, op, name_stack, source, node,
        params (str, object arrays), call, parent, step, iter (int64; -1 = none),
        n_outputs (int64) and out_dtype / out_shape (str: first output value, "" if none).
        """
        e = self.events
        strings = np.array(self.strings + [""], dtype=object)

        def resolve(col):
            idx = e[col].astype(np.int64)
            idx = np.where((idx >= 0) & (idx < len(self.strings)), idx, len(self.strings))
            return strings[idx]

        def names(col, table):
            lut = np.array([table.get(i, "?") for i in range(256)], dtype=object)
            return lut[e[col].astype(np.int64)]

        n = len(e)
        out_rows = self.values[self.values["role"] == schema.ROLE_OUT]
        n_out = np.bincount(out_rows["event"].astype(np.int64), minlength=n)[:n] \
            if len(out_rows) else np.zeros(n, np.int64)
        first = out_rows[out_rows["slot"] == 0]
        out_dtype = np.full(n, "", dtype=object)
        out_shape = np.full(n, "", dtype=object)
        if len(first):
            ev = first["event"].astype(np.int64)
            out_dtype[ev] = strings[np.where(first["dtype"] >= 0, first["dtype"], len(self.strings))]
            out_shape[ev] = strings[np.where(first["shape"] >= 0, first["shape"], len(self.strings))]
        return {
            "index": np.arange(n, dtype=np.int64),
            "framework": names("framework", schema.FW_NAMES),
            "kind": names("kind", schema.KIND_NAMES),
            "phase": names("phase", schema.PHASE_NAMES),
            "origin": names("origin", schema.ORIGIN_NAMES),
            "op": resolve("op"), "name_stack": resolve("name_stack"), "source": resolve("source"),
            "node": resolve("node"), "params": resolve("params"),
            "call": e["call"].astype(np.int64), "parent": e["parent"].astype(np.int64),
            "step": e["step"].astype(np.int64), "iter": e["iter"].astype(np.int64),
            "n_outputs": n_out.astype(np.int64), "out_dtype": out_dtype, "out_shape": out_shape,
        }

    def outputs(self, eid):
        """The output values of event `eid` as numpy arrays, by slot (None where a value
        was not stored, e.g. uninitialised memory)."""
        rows = self.value_rows(int(eid), schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        return [self.read_value(r) for r in rows]

    def value_rows(self, eid, role=None):
        """Rows of the values table for event `eid` (outputs by slot unless role given)."""
        lo, hi = np.searchsorted(self._v_sorted, [eid, eid + 1])
        rows = self.values[self._v_order[lo:hi]]
        if role is not None:
            rows = rows[rows["role"] == role]
        return rows

    def input_rows(self, eid):
        lo, hi = np.searchsorted(self._i_sorted, [eid, eid + 1])
        rows = self.inputs[self._i_order[lo:hi]]
        return rows[np.argsort(rows["slot"], kind="stable")]

    # -- statistics (--level stats) ---------------------------------------------------------
    def value_stats(self, row):
        """Statistics of one values-table row as a dict (`values.STAT_FIELDS`: min, max, mean,
        l2, nan, inf), from the stats table for a stats-only value (VFLAG_STATS) or computed
        from the stored bytes; None when neither exists (metadata-only values)."""
        if row["flags"] & schema.VFLAG_STATS:
            if self._stats_index is None:
                self._build_stats_index()
            keys, order = self._stats_index
            k = (int(row["event"]) << 21) | (int(row["role"]) << 20) | (int(row["slot"]) & 0xFFFFF)
            i = int(np.searchsorted(keys, k))
            if i < len(keys) and keys[i] == k:
                r = self.stats_rows[order[i]]
                return {f: (int(r[f]) if f in ("nan", "inf") else float(r[f]))
                        for f in values.STAT_FIELDS}
            return None
        x = self.read_value(row)
        if x is None:
            return None
        st = values.value_stats(np.asarray(x).view(self.string(row["storage"])),
                                self.string(row["dtype"]))
        return dict(zip(values.STAT_FIELDS, (int(v) if f in ("nan", "inf") else v
                                             for f, v in zip(values.STAT_FIELDS, st))))

    def _build_stats_index(self):
        st = self.stats_rows
        ok = (st["value"] >= 0) & (st["value"] < len(self.values))
        st_idx = np.flatnonzero(ok)
        v = self.values[st["value"][ok]]
        keys = (v["event"].astype(np.int64) << 21) | (v["role"].astype(np.int64) << 20) | \
            (v["slot"].astype(np.int64) & 0xFFFFF)
        order = np.argsort(keys, kind="stable")
        self._stats_index = (keys[order], st_idx[order])

    def value_meta(self, row):
        s = self.string
        return {"dtype": s(row["dtype"]), "shape": list(values.parse_shape(s(row["shape"]))),
                "name": s(row["name"]) if row["name"] >= 0 else None,
                "stored": bool(row["offset"] >= 0 and not row["flags"] & schema.VFLAG_NOT_STORED),
                "uninitialized": bool(row["flags"] & schema.VFLAG_UNINIT),
                "hash": f"{int(row['hash']):016x}", "nbytes": int(row["nbytes"])}

    def read_value(self, row):
        """The numpy array stored for one values-table row, or None if not stored."""
        if row["offset"] < 0 or row["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT):
            return None
        off, n = int(row["offset"]), int(row["nbytes"])
        if n < 0 or off + n > self.blob_size:
            raise TraceError(f"{self.path}: value bytes lie outside the stored data (truncated?)")
        storage = self.string(row["storage"])
        shape = values.parse_shape(self.string(row["shape"]))
        try:
            itemsize = np.dtype(storage).itemsize if storage in values._NATIVE else 0
        except TypeError:
            itemsize = 0
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if itemsize == 0 or count * itemsize != n:
            raise TraceError(f"{self.path}: value size does not match its shape and dtype")
        raw = self._f["blob"][off:off + n].tobytes()
        return values.decode(raw, self.string(row["dtype"]), storage, shape)

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
