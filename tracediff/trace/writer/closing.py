"""The end of a recording: the final manifest, `close` (the trace marked complete, then
rewritten without its chunks' empty tails where small, `_compact` / `write_finished`), a
recording stopped early (its reason noted without risking the last commit), and a trace
that is gone (deleted, replaced) or a forked child's, which is never touched.

A part of `TraceWriter` (writer/__init__.py); `write_finished` also writes the traces
`tracediff slice` makes (trace/slice.py).
"""

import json
import os
import shutil

import h5py
import numpy as np

from .. import schema
from . import settings
from .pending import _PendingBytes
from .signals import _signals_deferred


class _Closing:
    """The manifest, `close`, compaction, and a lost trace or a forked child's writer."""

    # -- manifest --------------------------------------------------------------------------
    @_signals_deferred
    def update_manifest(self, **fields):
        self._manifest.update(fields)
        self._quiet()
        if not self.closed and not self._check_file():
            self._f["manifest"][()] = self._manifest_text()

    def _manifest_text(self):
        return json.dumps(self._manifest, sort_keys=True, default=str)

    # -- the end ---------------------------------------------------------------------------
    @_signals_deferred
    def close(self, **manifest_fields):
        """Flush, store the final manifest fields (how the run ended) and mark complete.

        After a write error the trace stays incomplete (`complete` False, its last commit
        readable); the final fields and the error are added to its manifest if the disk
        lets us, which it may not. A lost trace (`lost`) and a forked child's writer are
        not touched."""
        if self.forked or self.lost:
            self.closed = True
            return
        if self.closed:
            if self.error and not getattr(self, "_error_noted", False):
                self._error_noted = True
                self._manifest.update(manifest_fields)
                self._manifest["recording_error"] = self.error
                if not self.unclosed and self._file.at_path():
                    self._note_error()
            return
        self.flush()
        if self.closed:  # the flush failed
            return self.close(**manifest_fields)
        try:
            if manifest_fields:
                self.update_manifest(**manifest_fields)
            if self._check_file():
                return
            self._f.flush()
            self._f.attrs["complete"] = True
            self._f.close()
        except Exception as exc:
            self._fail(exc)
            return self.close(**manifest_fields)
        self.closed = True
        # deleted or replaced after the last write: the complete trace is not at the path
        self.lost = self._file.lost or self._file.check_path()
        if not self.lost and self._file.size() <= settings.COMPACT_BELOW:
            self._compact()
        self._file.close()

    def _note_error(self):
        """Put the final manifest (how the run ended, `recording_error`) into a trace whose
        recording stopped early, never at the cost of its last commit: the disk may be full,
        and a write failing half-way through the file would leave it unreadable. A small
        trace is rewritten beside itself and moved over it (`_compact`: a failed copy leaves
        the original); a large one is updated in place only with room to spare."""
        path, text = self._file.path, self._manifest_text()
        try:
            size = os.path.getsize(path)
            free = shutil.disk_usage(os.path.dirname(path)).free
            if size <= settings.COMPACT_BELOW:
                if free >= size + settings.RESERVE_BYTES:
                    self._compact(manifest=text)
            elif free >= settings.RESERVE_BYTES + 4 * len(text):
                with h5py.File(path, "r+", libver="earliest") as f:
                    f["manifest"][()] = text
        except Exception:
            pass

    def _compact(self, manifest=None):
        """Rewrite the finished trace without the empty tails of its chunks
        (`write_finished`, replacing it atomically), with `manifest` (JSON text) if given.
        Any failure keeps the chunked original, which is just as valid, so a problem here
        never costs the trace."""
        try:
            with h5py.File(self._file.path, "r", locking=False) as src:
                tables = {}
                for name in list(schema.TABLES) + ["blob", "strings"]:
                    ds = src[name]
                    tables[name] = ds[:int(src.attrs.get(f"committed_{name}", ds.shape[0]))]
                manifest = src["manifest"][()] if manifest is None else manifest
                attrs = dict(src.attrs)
            if self._file.check_path():   # the path changed hands meanwhile: leave it
                return
            write_finished(self._file.path, tables, manifest, attrs, replace=True,
                           blob_filter=self._blob_filter)
            self.compacted = True
        except Exception:
            pass

    @property
    def reopened(self):
        """How many times the script closed the trace's descriptor and it was reopened."""
        return self._file.reopened

    def _check_file(self):
        """True (and recording stopped, `lost` set) once the trace is gone: the script
        deleted or replaced it, or closed its descriptor and the path no longer holds it."""
        if self.lost is None:
            self.lost = self._file.lost or self._file.check_path()
            if self.lost is None:
                return False
        self._drop_buffers()
        if not self.closed:
            self.closed = True
            self._file.discard()    # HDF5 may write while closing: into nothing
            try:
                self._f.close()
            except Exception:
                pass
            self._file.close()
        return True

    def _drop_buffers(self):
        self._quiet()
        self._synced = None
        self._rows = {name: [] for name in schema.TABLES}
        self._blob = _PendingBytes()
        self._new_strings = []
        self._pstats, self._pstats_bytes, self._arenas = {}, 0, {}

    def _after_fork_in_child(self):
        """In a forked child: never write, flush or close the parent's trace. HDF5's own
        clean-up (h5py finalizers, the library's exit handler) still runs in the child;
        `TraceFile.discard` makes whatever it writes go nowhere."""
        self.forked = True
        self.closed = True
        self.before_event = None
        self._file.discard()
        self._drop_buffers()


def write_finished(path, tables, manifest, attrs, replace=False, blob_filter=None):
    """Write a finished trace in one go: `tables` maps each table (schema.TABLES) and
    "blob" / "strings" to its rows, `manifest` is the JSON text, `attrs` the root
    attributes (the committed_* counts are set from the rows). Each dataset is one chunk of
    about its size (appendable like a recorded trace, no empty tails).

    Written to a temporary file beside `path`, fsynced, then moved there atomically: with
    `replace`, over whatever is there; without, only if nothing is (FileExistsError).
    `blob_filter`: the codec's dataset options for "blob" (trace/codec.py), or None."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w-", libver="earliest") as f:
            for key, value in attrs.items():
                f.attrs[key] = value
            dtypes = {**schema.TABLES, "blob": np.dtype("u1"),
                      "strings": h5py.string_dtype("utf-8")}
            for name, dt in dtypes.items():
                rows = tables.get(name)
                rows = np.zeros(0, dt) if rows is None else (
                    np.asarray(rows, dtype=object) if name == "strings" else np.asarray(rows, dt))
                chunk = max(len(rows), 4096 // max(np.dtype(dt).itemsize, 1), 1)
                f.create_dataset(name, data=rows, dtype=dt, maxshape=(None,), chunks=(chunk,),
                                 **((blob_filter or {}) if name == "blob" else {}))
                f.attrs[f"committed_{name}"] = len(rows)
            f.create_dataset("manifest", data=manifest, dtype=h5py.string_dtype("utf-8"))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)      # fails if `path` exists: never overwrites
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
