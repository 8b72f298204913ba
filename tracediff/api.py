"""Python API for notebooks and tests: record a block of code in the current process.

    import tracediff

    with tracediff.record("a.h5"):
        train(steps=3)

    @tracediff.record("b.h5")
    def train_once():
        train(steps=3)

    result = tracediff.locate("a.h5", "b.h5")
    print(result.verdict, tracediff.to_json(result)["first_beyond_tolerance"])

The block is recorded with the same captures and trace writer as `tracediff record`
(`runner.recording.Recording`): frameworks already imported are captured at once, frameworks
imported inside the block when they are imported, and everything is uninstalled when
the block ends, so successive blocks work. The manifest says
`recording.tool = "tracediff.record()"`; an exception in the block is recorded as the
run's end ({"status": "exception", ...}) and propagates unchanged.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, Iterable, Optional, TypeVar, Union

from .capture import RecordOptions

F = TypeVar("F", bound=Callable)


class record:
    """Record the code inside a `with` block (or a decorated function) into `path`.

    Options, as `tracediff record`'s: `level` ("full", "stats", "calls"), `loops`
    ("opaque" or "stepped"), the windows `steps` ("30:40"), `ops` (regex), `modules`
    (globs), `max_bytes` ("2GB"), `probe` (regex on jit function names), `devices`
    (JAX per-device capture, default True), `jax_values` ("auto", "replay" or "compiled":
    where JAX equation values come from), `hash` ("auto", "xxh3_64", "words64"), `codec` ("none" or "zstd": compression of the stored
    value bytes), and `frameworks` (default: jax and torch, each
    captured once it is imported). A bad
    option raises ValueError. Source lines are shown relative to the folder of the file
    that opens the block.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, level: str = "full",
                 loops: str = "opaque", steps: Optional[str] = None, ops: Optional[str] = None,
                 modules: Optional[Union[str, Iterable[str]]] = None,
                 max_bytes: Optional[Union[str, int]] = None, probe: Optional[str] = None,
                 jax_values: str = "auto", codec: str = "none",
                 frameworks: Iterable[str] = ("jax", "torch"), devices: bool = True,
                 hash: str = "auto") -> None:
        self.path = os.fspath(path)
        self.options = RecordOptions(level=level, loops=loops, steps=steps, ops=ops,
                                     modules=modules, max_bytes=max_bytes, probe=probe,
                                     devices=devices, jax_values=jax_values, codec=codec,
                                     hash=hash)
        self.frameworks = tuple(frameworks)
        for fw in self.frameworks:
            if fw not in ("jax", "torch"):
                raise ValueError(f"unknown framework {fw!r}: use 'jax' and/or 'torch'")
        self._rec = None

    def _start(self, caller_file):
        from .runner.recording import Recording

        if self._rec is not None:
            raise RuntimeError("tracediff.record(): this block is already recording "
                               "(nested use of one record object)")
        script = caller_file if caller_file and os.path.isfile(caller_file) else None
        self._rec = Recording(self.path, self.options, self.frameworks, script=script,
                              argv=list(sys.argv), tool="tracediff.record()",
                              script_dir=os.path.dirname(os.path.abspath(script)) if script else None)
        try:
            self._rec.start()
        except BaseException:
            self._rec = None
            raise
        return self

    def _stop(self, exc_type, exc):
        rec, self._rec = self._rec, None
        if rec is None:
            return
        if exc_type is None:
            end = {"status": "completed", "exit_code": 0}
        elif issubclass(exc_type, SystemExit):
            from .runner.signals import exit_status

            end = {"status": "sys.exit", "exit_code": exit_status(exc.code)}
        elif issubclass(exc_type, KeyboardInterrupt):
            end = {"status": "interrupted (SIGINT)", "exit_code": 130}
        else:
            end = {"status": "exception", "exit_code": 1, "exception": exc_type.__name__,
                   "message": str(exc)[:2000]}
        rec.stop(end)

    def __enter__(self) -> "record":
        return self._start(sys._getframe(1).f_code.co_filename)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._stop(exc_type, exc)
        return False

    def __call__(self, fn: F) -> F:
        """Use as a decorator: every call of `fn` is recorded (each call rewrites the file)."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._start(fn.__code__.co_filename if hasattr(fn, "__code__") else None)
            try:
                out = fn(*args, **kwargs)
            except BaseException as exc:
                self._stop(type(exc), exc)
                raise
            self._stop(None, None)
            return out

        return wrapper
