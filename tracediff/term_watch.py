"""SIGTERM while the recorded script's main thread is blocked in a C call.

Why: Python runs a signal's handler only between bytecodes of the main thread. A plain
script blocked in a call that retries on EINTR (`jax.distributed.initialize` waiting for
a peer that never comes, `system()`, a C library's own wait) dies at once by SIGTERM's
default action; recorded, tracediff's handler (which closes the trace, then ends the
process by SIGTERM) ran only when that call returned: one recorded run outlived its
`timeout 100` by five minutes. The recording changed how the program ends.

So the C-level handler's write of the signal's number to a socket
(`signal.set_wakeup_fd`) wakes a thread at once. It gives the main thread `GRACE`
seconds to take the signal (`taken`, set by the handler); if it does not, the thread
closes the trace (its end says the script was blocked) and ends the process by SIGTERM,
as the plain script would have ended. A script that sets its own wakeup fd (asyncio's
loop) keeps it: then only the handler runs, as before. A script that closes every
descriptor (`os.closerange`) closes the sockets too: they sit at numbers >= 1000 (its
files reopen at the lowest free ones), and what is no longer ours is left alone.
"""

import fcntl
import os
import signal
import socket
import threading

GRACE = 2.0                 # seconds the main thread has to take SIGTERM itself
taken = threading.Event()   # set by the Python-level SIGTERM handler (runner._on_sigterm)
_active = []                # the wakeup fd a TermWatch set, while it is set


class TermWatch:
    """Context manager around the script's run (main thread only; see the module
    docstring). `stop(end)` closes the trace from the watch thread and flushes the
    standard streams, never raising (runner._ProcessEnds.stop); `exit_by_signal(signum,
    finalize)` ends the process by that signal from any thread (runner.exit_by_signal)."""

    def __init__(self, stop, exit_by_signal):
        self.stop = stop
        self.exit_by_signal = exit_by_signal
        self.sockets = None
        self.thread = None

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            r, w = _high(socket.socketpair())
            w.setblocking(False)
        except OSError:
            return self
        try:
            previous = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            r.close()
            w.close()
            return self
        if previous != -1:           # the caller's own (an event loop): leave it theirs
            signal.set_wakeup_fd(previous)
            r.close()
            w.close()
            return self
        taken.clear()
        self.sockets = (r, w)
        self.ids = (_identity(r.fileno()), _identity(w.fileno()))
        _active.append(w.fileno())
        self.thread = threading.Thread(target=self._watch, name="tracediff-sigterm",
                                       daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.sockets is None:
            return
        r, w = self.sockets
        if _active:
            _active.pop()
        try:
            mine = signal.set_wakeup_fd(-1)
            if mine != w.fileno():          # the script set its own since: put it back
                signal.set_wakeup_fd(mine)
        except (ValueError, OSError):
            pass
        # a script that closed every descriptor (os.closerange) may hold these numbers
        # for its own files now: never shut down or close what is no longer ours
        ours = [_identity(x.fileno()) == i for x, i in zip((r, w), self.ids)]
        if ours[0]:
            try:
                r.shutdown(socket.SHUT_RDWR)    # ends the thread's recv
            except OSError:
                pass
        self.thread.join(timeout=5 if ours[0] else 0.1)
        for sock, mine in zip((r, w), ours):
            if mine:
                sock.close()
            else:
                sock.detach()
        self.sockets = None

    def _watch(self):
        r = self.sockets[0]
        pid = os.getpid()
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM not in data or os.getpid() != pid:
                continue
            if taken.wait(GRACE):
                return              # the main thread took it: it closes the trace
            self._end()
            return

    def _end(self):
        end = {"status": "terminated (SIGTERM)", "exit_code": 143, "exception": "SIGTERM",
               "signal": int(signal.SIGTERM),
               "message": (f"SIGTERM while the script's main thread was blocked in a call "
                           f"that did not return within {GRACE:g} s; the trace was closed "
                           f"by tracediff's watch thread")}
        try:
            self.stop(end)          # closes the trace, says so, flushes the streams
        finally:
            self.exit_by_signal(signal.SIGTERM, finalize=False)


def _high(pair, low=1000):
    """The sockets moved to descriptors numbered `low` or more: a script that closes every
    descriptor and opens files again gets the lowest free numbers, not these, so the
    interpreter's writes of signal numbers never land in its files."""
    out = []
    for sock in pair:
        try:
            fd = fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, low)
        except OSError:
            out.append(sock)
            continue
        out.append(socket.socket(sock.family, sock.type, sock.proto, fileno=fd))
        sock.close()
    return out


def _identity(fd):
    """(device, inode) of a descriptor, or None when it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def forget_in_child():
    """In a child the script forks: the parent's socket is not the child's to write to (its
    signals would wake the parent's watch). No-op unless the wakeup fd is still ours."""
    if not _active:
        return
    try:
        fd = signal.set_wakeup_fd(-1)
        if fd != _active[-1]:
            signal.set_wakeup_fd(fd)
    except (ValueError, OSError):
        pass
    _active.clear()
