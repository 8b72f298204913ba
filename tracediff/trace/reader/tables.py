"""The trace's rows as the reports read them: strings by index, one event as a dict,
the events as columns (`events_table`), the value and input rows of an event, the
recorded source lines around a site, and an optimizer step's settings.

A part of `Trace` (reader/__init__.py).
"""

import numpy as np

from .. import schema
from ..sources import LIB_SEP, parse_source, split_site


class _Tables:
    """Strings, events, value and input rows, source lines, optimizer settings."""

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
        user, lib = split_site(s(e["source"]))
        return {
            "index": int(eid),
            "framework": schema.FW_NAMES.get(int(e["framework"]), "?"),
            "kind": schema.KIND_NAMES.get(int(e["kind"]), "?"),
            "phase": schema.PHASE_NAMES.get(int(e["phase"]), "?"),
            "origin": schema.ORIGIN_NAMES.get(int(e["origin"]), "?"),
            "op": s(e["op"]), "params": s(e["params"]), "name_stack": s(e["name_stack"]),
            "source": user, "lib_source": lib, "node": s(e["node"]),
            "call": int(e["call"]), "parent": int(e["parent"]), "step": int(e["step"]),
            "iter": int(e["iter"]), "device": self.event_device(eid) if len(self.device_rows) else "",
        }

    def events_table(self):
        """The events as a dict of equal-length numpy columns, strings resolved, for
        `pandas.DataFrame(t.events_table())` (pandas is not needed otherwise).

        Columns: index, framework, kind, phase, origin, op, name_stack, source (the user's
        file:line), lib_source (the library's, "" when the op ran in the user's code), node,
        params (str, object arrays), call, parent, step, iter (int64; -1 = none),
        n_outputs (int64) and out_dtype / out_shape (str: first output value, "" if none),
        device (str: the one device of a per-device event, "" for none).
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
            "op": resolve("op"), "name_stack": resolve("name_stack"),
            **self._site_columns(resolve("source")), "node": resolve("node"), "params": resolve("params"),
            "call": e["call"].astype(np.int64), "parent": e["parent"].astype(np.int64),
            "step": e["step"].astype(np.int64), "iter": e["iter"].astype(np.int64),
            "n_outputs": n_out.astype(np.int64), "out_dtype": out_dtype, "out_shape": out_shape,
            "device": self._device_column(n, strings),
        }

    @staticmethod
    def _site_columns(col):
        """{"source": user sites, "lib_source": library sites} of a resolved events.source
        column ("LIB ← USER" split, trace/sources.py)."""
        user, lib = col.copy(), np.full(len(col), "", dtype=object)
        for text in set(col.tolist()):
            if isinstance(text, str) and LIB_SEP in text:
                k = col == text
                user[k], lib[k] = split_site(text)
        return {"source": user, "lib_source": lib}

    def _device_column(self, n, strings):
        col = np.full(n, "", dtype=object)
        d = self.device_rows
        if len(d):
            col[d["event"].astype(np.int64)[::-1]] = \
                strings[np.where(d["device"] >= 0, d["device"], len(self.strings))[::-1]]
        return col

    def value_rows(self, eid, role=None):
        """Rows of the values table for event `eid` (outputs by slot unless role given)."""
        return self.values[self.value_row_ids(eid, role)]

    def value_row_ids(self, eid, role=None):
        """The row numbers in the values table of event `eid`'s values (of one role)."""
        lo, hi = np.searchsorted(self._v_sorted, [eid, eid + 1])
        ids = self._v_order[lo:hi]
        if role is not None:
            ids = ids[self.values["role"][ids] == role]
        return ids

    def input_rows(self, eid):
        lo, hi = np.searchsorted(self._i_sorted, [eid, eid + 1])
        rows = self.inputs[self._i_order[lo:hi]]
        return rows[np.argsort(rows["slot"], kind="stable")]

    def optim_settings(self, event_index):
        """The settings recorded for optimizer-step event `event_index` (the
        `optim_settings` table): [(group, key, value, text)], keys and texts as recorded
        (untrusted), value a float (NaN: no number); [] where none were recorded (an older
        trace, or a framework that exposes none)."""
        rows = self.optim_setting_rows
        if not len(rows):
            return []
        hit = rows[rows["event"] == int(event_index)]
        return [(int(r["group"]), self.string(r["key"]), float(r["value"]),
                 self.string(r["text"]) if r["text"] >= 0 else "") for r in hit]

    # -- recorded source lines ---------------------------------------------------------------
    MAX_SOURCE_LINES = 11   # lines returned per source (the recorder stores up to 5)

    MAX_SOURCE_LINE = 240   # characters per line (as the recorder cuts them)

    def source_lines(self, source):
        """The lines recorded around `source` ("file.py:LINE", an events.source string):
        {"file", "line", "first", "lines": [(number, text)], "sha256" (hex or None)}, or
        None when the trace holds none (older traces, files the recorder could not read).

        Bounded (at most MAX_SOURCE_LINES lines of MAX_SOURCE_LINE characters) but not
        sanitised: the text is the trace's, renderers escape it for their output."""

        parsed = parse_source(source)
        if parsed is None or not len(self.source_rows):
            return None
        # the string itself, and each "LIB ← USER" site whose user part it is
        ids = [i for i, s in enumerate(self.strings)
               if s == source or (LIB_SEP in s and split_site(s)[0] == source)]
        rows = self.source_rows[np.isin(self.source_rows["source"], ids)]  # no per-row loop
        if not len(rows) or rows[0]["lines"] < 0:   # the first row of a source wins
            return None
        row = rows[0]
        first = int(row["first"])
        if first < 1:
            return None
        text = self.string(row["lines"]).split("\n")[:self.MAX_SOURCE_LINES]
        lines = [(first + k, t if len(t) <= self.MAX_SOURCE_LINE else
                  t[:self.MAX_SOURCE_LINE - 1] + "…") for k, t in enumerate(text)]
        sha = self.string(row["sha256"]).lower() if row["sha256"] >= 0 else ""
        ok = len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)
        return {"file": parsed[0], "line": parsed[1], "first": first, "lines": lines,
                "sha256": sha if ok else None}
