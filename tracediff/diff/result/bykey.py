"""Read access by key next to attribute access, for every result type (`finding.a["op"]`
is `finding.a.op`): the types replaced dicts, and code written against those keeps
working; `repr` shows only the fields that are set."""

from __future__ import annotations

import dataclasses


class _ByKey:
    """Read access by key next to attribute access (`x["op"]` is `x.op`): the result
    types replaced dicts, and code written against those keeps working. `"k" in x` and
    `x.get("k")` treat a field set to None as absent, like the JSON."""

    __slots__ = ()

    def _has(self, key):
        return isinstance(key, str) and key in _field_names(type(self))

    def __getitem__(self, key):
        if not self._has(key):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key, default=None):
        value = getattr(self, key) if self._has(key) else None
        return default if value is None else value

    def __contains__(self, key):
        return self._has(key) and getattr(self, key) is not None

    def __repr__(self):
        """Only the fields that are set (differ from their default): short in a notebook."""
        shown = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
            if default is dataclasses.MISSING or v != default:
                shown.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


_NAMES: dict = {}


def _field_names(cls):
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names
