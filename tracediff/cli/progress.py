"""The progress bar of the long comparisons (locate, explain): drawn on stderr only on a
terminal and only once the work has run a while, so that a quick or piped run prints
nothing extra.
"""

import os
import sys


class ProgressBar:
    """A transient rich progress bar on stderr for `locate`/`explain` (phase, bar, work
    done), only on a terminal, and only once the work has run `DELAY_S` seconds (a quick
    locate prints nothing extra: a timer starts the bar, so a long phase that reports
    nothing still shows it); elsewhere a no-op callback."""

    DELAY_S = 2.0

    def __init__(self, quiet=False):
        import threading

        self._bar, self._task, self._timer = None, None, None
        self._last = ("reading traces", None, None)
        self._lock, self._done = threading.Lock(), False
        self._on = not (quiet or os.environ.get("TRACEDIFF_NO_PROGRESS") or
                        not sys.stderr.isatty())

    def _start(self):
        from rich.console import Console
        from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeElapsedColumn)

        with self._lock:
            if self._done:
                return
            phase, done, total = self._last
            self._bar = Progress(TextColumn("tracediff: {task.description}"), BarColumn(),
                                 TaskProgressColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task(phase, total=total, completed=done or 0)
            self._bar.start()

    def __call__(self, phase, done=None, total=None):
        if not self._on:
            return
        with self._lock:
            self._last = (phase, done, total)
            if self._bar is not None:
                self._bar.update(self._task, description=phase, completed=done or 0,
                                 total=total)

    def __enter__(self):
        if self._on:
            import threading

            self._timer = threading.Timer(self.DELAY_S, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            if self._bar is not None:
                self._bar.stop()
