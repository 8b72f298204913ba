"""How a recording ends: the captures uninstalled, the manifest completed with how the run
ended and what each framework did, the trace closed, and every way it can be short said
on stderr (a framework loaded but not recorded, a lost or unreadable trace, a descriptor
the script closed). `ProcessEnds` closes it too where the script ends the process without
unwinding (`os._exit`, `os.exec*`).
"""

import gc
import os
import sys

from ..term_watch import descriptor_identity
from ..trace.manifest import capture_losses, native_libraries


class Closing:
    """The closing phase of a `Recording` (recording.py, which sets what it reads:
    `writer`, `session`, `watcher`, `output`, `pid`, `signals_taken`, `incomplete`,
    `_old_gc`, `_stopped`)."""

    @property
    def lost(self):
        """Why the trace is not at its path (deleted, replaced, its descriptor closed by
        the script and the path gone), or None."""
        return self.writer.lost if self.writer is not None else None

    def stop(self, end=None, report_lost=True):
        """`report_lost=False`: the caller reports a lost trace itself (`lost`)."""
        if self.writer is None or self._stopped:
            return
        if os.getpid() != self.pid or self.writer.forked:
            return   # a forked child: the trace, captures and gc settings are the parent's
        self._stopped = True
        end = end or {"status": "completed", "exit_code": 0}
        if self.signals_taken:   # how the run ended was the script's handlers' call
            end = {**end, "signals_handled_by_script": list(self.signals_taken)}
        # A descriptor the script closed is found (and the trace reopened) on the next
        # write: do one now, so that the manifest below can say so.
        self.writer.flush()
        if self.watcher is not None:
            self.watcher.uninstall()
        frameworks_manifest = {}
        for cap in self.session.captures:
            try:
                cap.uninstall()
            except Exception as exc:  # never lose the trace over a clean-up error
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
            try:
                frameworks_manifest[cap.framework] = cap.manifest()
            except Exception as exc:
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
        frameworks_manifest["captured"] = [c.framework for c in self.session.captures]
        missed, late = self._unrecorded()
        if missed:
            frameworks_manifest["missed"] = missed
        if late:
            frameworks_manifest["captured_late"] = late
        try:
            self.writer.close(end=end, frameworks=frameworks_manifest, events=self.writer.n_events,
                              libraries=native_libraries(),   # loaded by the end of the run
                              bytes_recorded=self.writer.bytes_recorded,
                              recording=self._recording_summary())
        finally:
            if self._old_gc is not None:
                gc.set_threshold(*self._old_gc)
                self._old_gc = None
        for fw in missed:
            print(f"tracediff: WARNING: the script loaded {fw} but the trace holds none of its "
                  f"operations: {fw} was not recorded (the manifest says so under "
                  f"frameworks.missed; locate will not call this trace a match)",
                  file=sys.stderr)
        for line in capture_losses(frameworks_manifest):
            print(f"tracediff: WARNING: {line}", file=sys.stderr)
        for fw in late:
            print(f"tracediff: warning: {fw} was found loaded only after its import finished "
                  f"(loaded outside the import system); what it ran before that is not in the "
                  f"trace", file=sys.stderr)
        if self.writer.lost:
            if report_lost:
                print(f"tracediff: error: recording lost: {self.writer.lost}", file=sys.stderr)
            return
        if self.writer.error:
            # a write error (full disk): the trace must still open, or the run says so
            self.incomplete = why_unreadable(self.output)
            if self.incomplete:
                if report_lost:
                    print(f"tracediff: error: {self.incomplete_message()}", file=sys.stderr)
                return
        if self.writer.reopened:
            print(f"tracediff: warning: the script closed the trace's file descriptor; "
                  f"{self.output} was opened again and the trace is complete", file=sys.stderr)
        if self.writer.error:
            # The script ran to its end; only the trace is short. Say so, keep its exit code.
            print(f"tracediff: warning: recording stopped early, the trace {self.output} is "
                  f"truncated after {self.writer.committed_events} events "
                  f"({self.writer.error})", file=sys.stderr)


    def incomplete_message(self):
        return (f"recording incomplete: {self.writer.error}, and the trace {self.output} "
                f"does not open ({self.incomplete})")

    def _unrecorded(self):
        """(frameworks the script loaded that have no capture, frameworks captured only
        once the watcher found them loaded by other means): never silent (issue #26)."""
        w = self.watcher
        if w is None:
            return [], []
        names = getattr(w, "frameworks", {})
        have = {c.framework for c in self.session.captures}
        missed = [names.get(m, m) for m in w.loaded_unwatched()]
        missed = sorted(set(missed) - have)
        late = sorted({names.get(m, m) for m in w.late} & have)
        return missed, late

    def _recording_summary(self):
        """The manifest's `recording` section completed with what the windows and the byte
        cap did (so every trace says how, and how much of the run, was recorded)."""
        w = self.writer
        rec = dict(w._manifest.get("recording") or {})
        rec["stats_values"] = w.stats_values
        if w.reopened:
            rec["reopened"] = w.reopened
        if w.max_bytes is not None:
            rec["max_bytes_reached"] = w.capped_at_event is not None
            if w.capped_at_event is not None:
                rec["values_capped_at_event"] = w.capped_at_event
                rec["note"] = (f"--max-bytes {w.max_bytes}: value bytes stop at event "
                               f"{w.capped_at_event}; later values have hash and statistics only")
        return rec


def why_unreadable(path):
    """Why the trace at PATH does not open, or None (it opens: its committed events are
    all readable)."""
    from ..trace.reader import Trace

    try:
        with Trace(path) as t:
            len(t)
    except Exception as exc:
        return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return None


class ProcessEnds:
    """`os._exit` and `os.exec*` end the process without unwinding (no finally, no
    atexit), which would leave the trace with only what the last flush committed.
    While the script runs they first stop the recording (the trace is closed and
    complete; its end says how), then do what they do. A forked child's calls go straight
    through (the trace is its parent's). `os.execl*`/`execvp*` call `os.execv`/`execve`."""

    def __init__(self, rec):
        self.rec = rec
        self.saved = {}
        self.stderr = descriptor_identity(2)   # the script's stderr when it started

    def __enter__(self):
        self.stderr = descriptor_identity(2)
        for name, wrap in (("_exit", self._exit), ("execv", self._exec("execv")),
                           ("execve", self._exec("execve"))):
            if hasattr(os, name):
                self.saved[name] = getattr(os, name)
                setattr(os, name, wrap)
        return self

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(os, name, real)

    def _ours(self):
        return os.getpid() == self.rec.pid and not self.rec._stopped

    def _exit(self, status):
        try:
            if self._ours():
                code = status if isinstance(status, int) and not isinstance(status, bool) \
                    else 1
                self.stop({"status": "os._exit", "exit_code": code & 0xFF})
        finally:   # whatever closing the trace met, the process ends as the script asked
            self.saved["_exit"](status)

    def _exec(self, name):
        def exec_(path, args, *env):
            if not self._ours():
                return self.saved[name](path, args, *env)
            self.stop({"status": "exec", "exit_code": None,
                        "message": f"os.{name}({os.fsdecode(path)!r}, ...)"[:2000]})
            try:
                return self.saved[name](path, args, *env)
            except BaseException:
                _say(f"tracediff: warning: os.{name} failed after the trace was closed; "
                     f"the rest of the script is not recorded")
                raise
        return exec_

    def stop(self, end):
        """Close the trace with `end` (from any thread: os._exit, exec, SIGTERM). The
        process ends next without flushing what the script's sys.stdout and sys.stderr
        hold (os._exit, exec and SIGTERM's default action do not): tracediff's lines go
        straight to descriptor 2 (while it is still the script's stderr), the script's
        streams are left unflushed. Before, that output was written, which the plain run
        never writes."""
        rec = self.rec
        script_stderr = sys.stderr
        sys.stderr = _raw_stderr(self.stderr)
        try:
            rec.stop(end)
            if not rec.lost and not rec.incomplete:
                _say(f"tracediff: trace written to {rec.output} ({end['status']})")
        except Exception as exc:   # never keep the script from ending as it asked
            _say(f"tracediff: error: closing the trace at {end['status']}: {exc}")
        finally:
            sys.stderr = script_stderr


def _raw_stderr(identity):
    """A writer straight to descriptor 2 (nothing held back), or to os.devnull where the
    script closed its stderr or reused the number for a file of its own."""
    try:
        if identity is not None and descriptor_identity(2) == identity:
            return open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        return open(os.devnull, "w")
    except OSError:
        return open(os.devnull, "w")


def _say(line):
    """One line to stderr, which the script may have closed (`os.closerange(0, ...)`): a
    message that cannot be written is dropped, never raised into the script's exit."""
    try:
        print(line, file=sys.stderr)
    except Exception:
        pass
