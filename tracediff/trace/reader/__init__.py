"""Read a trace safely: plain h5py reads of numbers, strings and JSON; nothing executed.

Tables are loaded whole (a few dozen bytes per row); values are read lazily from the
byte arena, one slice each, after checking that the slice lies inside it.

Sizes are checked before anything is read (a hostile file must not make the reader
allocate or work in proportion to what it claims): tables by rows x row size against the
file's size; the manifest by the length in its heap reference (`MAX_MANIFEST_BYTES`);
every variable-length string object in the file against `MAX_HEAP_OBJECT_BYTES`; the
strings table by its count (`MAX_STRINGS`), and only the strings that the events and
values tables refer to are read (a string nobody refers to is never shown), in ranges
whose lengths are checked first (`MAX_ONE_STRING_BYTES` each, `MAX_STRING_BYTES` in all).

`Trace` is put together from one part per concern, each in its own module: loading.py
(tables, strings, value bytes and manifest, bounded) and checks.py (the rows' cross
references), over opening.py (the file and its objects), heaps.py (HDF5's string heaps
checked first) and limits.py (the bounds); then what the reports read: tables.py
(strings, events, rows, source lines), value_reads.py (values, statistics) and
devices.py (per-device values, placements).
"""

import os

from ...errors import TraceError, one_line
from .checks import _Checks
from .devices import _DeviceValues, DeviceValue
from .loading import _Loading
from .opening import _open
from .tables import _Tables
from .value_reads import _ValueReads

__all__ = ["Trace", "DeviceValue"]


class Trace(_Loading, _Checks, _Tables, _ValueReads, _DeviceValues):
    """A recorded run: manifest, event/value/input tables, and lazy access to values.

    Opening checks everything a report could trip over, so a damaged or hostile file
    fails here with one `TraceError` line: table sizes against the file's size, string
    references, value shapes, dtypes and byte ranges, the manifest's types. `complete`
    is False for a recording that did not finish (killed): its committed rows are read.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = _open(self.path)
        try:
            self._load()
        except TraceError as exc:
            self._f.close()
            msg = str(exc)
            raise TraceError(msg if msg.startswith(self.path) else f"{self.path}: {msg}") from None
        except Exception as exc:  # h5py / numpy on a damaged file: one line, never a traceback
            self._f.close()
            raise TraceError(f"{self.path}: damaged trace ({one_line(exc, 160, with_type=True)})") from None

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
