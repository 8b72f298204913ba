"""Capture: one recorder per framework behind one small interface.

A `Capture` is installed when its framework is first imported by the recorded script
(or at once if it already is), writes events through the shared `Session`, and adds its
framework's configuration to the manifest when the run ends.
"""

import importlib.abc
import importlib.util
import os
import sys
import threading

from ..trace import schema


class RecordOptions:
    """What to record. `level`: full (all values); `loops`: opaque or stepped."""

    def __init__(self, level="full", loops="opaque"):
        if level not in ("full",):
            raise ValueError(f"unknown level {level!r}")
        if loops not in ("opaque", "stepped"):
            raise ValueError(f"unknown loop mode {loops!r}")
        self.level, self.loops = level, loops

    def as_dict(self):
        return {"level": self.level, "loops": self.loops}


class Session:
    """State shared by the captures of one recording: the writer, options, a lock."""

    def __init__(self, writer, options, tool_dirs=()):
        self.writer = writer
        self.options = options
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.script_dir = None
        self.tool_dirs = tuple(tool_dirs)
        self.captures = []
        self._user_files = {}

    @property
    def active(self):
        """False in forked children (DataLoader workers): they never write the parent's file."""
        return os.getpid() == self.pid and not self.writer.closed

    _LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep,
                        os.sep + "lib" + os.sep + "python3", "<frozen", "<string>")

    def is_user_file(self, filename):
        """True for the user's code: the script's folder, or anything outside libraries and
        tracediff itself (the bundled examples count as user code when they are the script)."""
        known = self._user_files.get(filename)
        if known is None:
            if self.script_dir and filename.startswith(self.script_dir + os.sep):
                known = True
            else:
                known = not (filename.startswith(self.tool_dirs)
                             or any(m in filename for m in self._LIBRARY_MARKERS))
            self._user_files[filename] = known
        return known

    def short_path(self, filename):
        """A source path as shown in reports: relative to the script's folder when inside it."""
        if self.script_dir and filename.startswith(self.script_dir + os.sep):
            return filename[len(self.script_dir) + 1:]
        return filename


class Capture:
    """Interface of a framework recorder."""

    framework = ""
    trigger = ""  # module whose import installs this capture

    def install(self, session):
        raise NotImplementedError

    def uninstall(self):
        raise NotImplementedError

    def manifest(self):
        """Framework configuration at the end of the run, merged into the manifest."""
        return {}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, callback):
        self.inner, self.callback = inner, callback

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.callback()


class ImportWatcher(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched top-level module finishes importing."""

    def __init__(self, callbacks):
        self.callbacks = dict(callbacks)
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        cb = self.callbacks.get(fullname)
        if cb is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        del self.callbacks[fullname]
        spec.loader = _Loader(spec.loader, cb)
        return spec

    def install(self):
        for name in list(self.callbacks):
            if name in sys.modules:
                self.callbacks.pop(name)()
        if self.callbacks:
            sys.meta_path.insert(0, self)

    def uninstall(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


# framework -> (module that triggers the capture, recorder module, recorder class).
# Recorder modules import their framework, so they are imported only once the script
# has imported it: a torch-only script never pays for importing JAX, and vice versa.
RECORDERS = {
    "jax": ("jax", "tracediff.capture.jax_recorder", "JaxCapture"),
    "torch": ("torch", "tracediff.capture.torch_recorder", "TorchCapture"),
}


def start_captures(session, frameworks=("jax", "torch")):
    """Arrange for each framework's capture to install when the script imports it."""
    import importlib

    callbacks = {}
    for framework in frameworks:
        trigger, module, cls_name = RECORDERS[framework]

        def _install(module=module, cls_name=cls_name):
            cap = getattr(importlib.import_module(module), cls_name)()
            cap.install(session)
            session.captures.append(cap)

        callbacks[trigger] = _install
    watcher = ImportWatcher(callbacks)
    watcher.install()
    return watcher


__all__ = ["Capture", "Session", "RecordOptions", "start_captures", "schema"]
