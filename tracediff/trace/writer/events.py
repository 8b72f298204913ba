"""The writer's event rows: the strings table (`intern`), events (one row per op,
equation, call or step, with the flush checks of the recorders' hot paths), their inputs,
the device an event ran on, the source lines of its site, and an optimizer step's settings.

A part of `TraceWriter` (writer/__init__.py), whose `__init__` sets the state used here:
`_strings`, `_new_strings`, `_source_ids`, `_rows`, `_counts`, `_last_flush`.
"""

import time

from .. import schema
from ..sources import LIB_SEP, split_site
from . import settings


class _Events:
    """Events, their inputs and devices, interned strings and recorded source lines."""

    # -- strings ---------------------------------------------------------------------------
    def intern(self, text):
        """Index of `text` in the strings table (-1 for None)."""
        if text is None:
            return -1
        idx = self._strings.get(text)
        if idx is None:
            idx = self._strings[text] = len(self._strings)
            self._new_strings.append(text)
        return idx

    def _strings_rev(self, idx):
        """The string of an interned id (-1: None); rare paths only (linear)."""
        if idx < 0:
            return None
        for text, i in self._strings.items():
            if i == idx:
                return text
        return None

    def source_id(self, source):
        """Interned id of an events.source string (its lines stored the first time)."""
        src = self._source_ids.get(source)
        if src is None:
            src = self._new_source(source)
        return src

    def _new_source(self, source):
        """Intern a source string seen for the first time and store its lines."""
        idx = self._source_ids[source] = self.intern(source)
        if self.source_lines is not None and LIB_SEP in source:   # the library line's too
            self.source_id(split_site(source)[1])
        if self.source_lines is not None:
            try:
                got = self.source_lines(source)
            except Exception:  # context only: never fail a recording over it
                got = None
            if got is not None:
                first, text, sha = got
                self._rows["sources"].append((idx, first, self.intern(text), self.intern(sha)))
        return idx

    # -- events ----------------------------------------------------------------------------
    @property
    def committed_events(self):
        """Events on disk as of the last commit (what a reader of a killed run gets)."""
        return self._committed_events

    @property
    def n_events(self):
        return self._counts["events"] + len(self._rows["events"])

    def add_event(self, *, framework, kind, op, phase=schema.PHASE_FWD, origin=schema.ORIGIN_NONE,
                  params=None, name_stack=None, source=None, node=None, call=-1, parent=-1,
                  step=0, iter=-1, device=None):
        """Append an event; returns its id (row number). `device` ("cpu:3"): the one
        device the event ran on (a row of the `devices` table), None for none."""
        if self.before_event is not None:   # e.g. a Ctrl-C to hand back (runner.py)
            self.before_event()
        eid = self.n_events
        s = self.intern
        src = self._source_ids.get(source)
        if src is None:
            src = self._new_source(source)
        self._rows["events"].append((framework, kind, phase, origin, s(op), s(params),
                                     s(name_stack), src, s(node), call, parent, step, iter))
        if device:
            self._rows["devices"].append((eid, s(device)))
        if len(self._rows["events"]) >= settings.FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= settings.FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def add_event_ids(self, framework, kind, phase, origin, op_id, params_id, ns_id, src_id,
                      node_id, call, parent, step, it=-1):
        """`add_event` with its strings already interned (`intern`, `source_id`): the
        recorders' hot path, one row append and the flush checks."""
        if self.before_event is not None:
            self.before_event()
        rows = self._rows["events"]
        eid = self._counts["events"] + len(rows)
        rows.append((framework, kind, phase, origin, op_id, params_id, ns_id, src_id, node_id,
                     call, parent, step, it))
        if len(rows) >= settings.FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= settings.FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def event_head(self, framework, kind, phase, origin, op, params, name_stack, source,
                   node=None):
        """The constant part of an event row (`add_event_row`), its strings interned as
        `add_event` interns them: built once per equation site by the JAX recorder."""
        src = self.source_id(source)
        s = self.intern
        return (framework, kind, phase, origin, s(op), s(params), s(name_stack), src, s(node))

    def add_event_row(self, head, call, parent, step, it, device_id=-1):
        """`add_event` from a row head (`event_head`) and the per-event fields: the same
        row, the same device row (`device_id`, an interned "platform:id", or -1) and the
        same flush checks; what is constant per site is not interned again."""
        if self.before_event is not None:
            self.before_event()
        rows = self._rows["events"]
        eid = self._counts["events"] + len(rows)
        rows.append(head + (call, parent, step, it))
        if device_id >= 0:
            self._rows["devices"].append((eid, device_id))
        if len(rows) >= settings.FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= settings.FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def after_rows(self):
        """The flush checks of rows appended in bulk (a planned call's events and values)."""
        if len(self._rows["events"]) >= settings.FLUSH_ROWS or \
                len(self._rows["values"]) >= settings.FLUSH_ROWS or \
                len(self._blob) >= self._flush_bytes or \
                time.monotonic() - self._last_flush >= settings.FLUSH_SECONDS:
            self._auto_flush()

    def set_device(self, event, device):
        """Tie an event already added to one device ("cpu:3")."""
        self._rows["devices"].append((int(event), self.intern(device)))

    def add_inputs(self, event, refs):
        """`add_input` for slots 0.. of `event`: refs is a list of (producer, slot)."""
        self._rows["inputs"].extend([(event, slot, p, q) for slot, (p, q) in enumerate(refs)])

    def add_input(self, event, slot, producer, producer_slot=0):
        self._rows["inputs"].append((event, slot, producer, producer_slot))

    def add_optim_setting(self, event, group, key, value, text):
        """One scalar setting of optimizer-step `event` (the `optim_settings` table): `value`
        a float (NaN where the setting is no number), `text` how the framework prints it."""
        self._rows["optim_settings"].append((int(event), int(group), self.intern(key),
                                             float(value), self.intern(text)))
