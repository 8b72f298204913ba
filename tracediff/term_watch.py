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
as the plain script would have ended.

Only while SIGTERM's handler is tracediff's own: a script that installs its own
(preemption: a flag, a checkpoint, then exit 0; or a handler that raises SystemExit and
a slow `finally`) or ignores SIGTERM decides how it ends, exactly as without tracediff,
and the trace is closed on the path it takes (its end lists the signals the script's
handlers took: `received`). Before, the watch killed such a run after 2 s, checkpoint
unwritten.

The wakeup fd stays the script's business: one set before (asyncio's loop) is kept, and
then only the handler runs, as before; the script never sees ours (`set_wakeup_fd`
answers -1 where it is set, and -1 from the script sets it back). The sockets sit at
numbers >= 1000 (a script that closes every descriptor and opens files again gets the
lowest free ones) and are reserved: the script's `os.closerange` leaves them open
(trace.writer.reserve_descriptor), so SIGTERM still ends a blocked run at once; what is
no longer ours (a `dup2` over one) is left alone.
"""

import fcntl
import os
import signal
import socket
import threading

from .trace.writer import installed_handler, release_descriptor, reserve_descriptor

GRACE = 2.0                 # seconds the main thread has to take SIGTERM itself
taken = threading.Event()   # set by the Python-level SIGTERM handler (runner.signals.on_sigterm)
_active = []                # the wakeup fd a TermWatch set, while it is set
_real_set_wakeup_fd = signal.set_wakeup_fd
# the signals whose arrival the trace's end records when the script's own handler took them
ENDING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT",
                                            "SIGUSR1", "SIGUSR2") if hasattr(signal, n))


class TermWatch:
    """Context manager around the script's run (main thread only; see the module
    docstring). `stop(end)` closes the trace from the watch thread and flushes the
    standard streams, never raising (runner.closing.ProcessEnds.stop); `exit_by_signal(signum,
    finalize)` ends the process by that signal from any thread (runner.signals.exit_by_signal);
    `handler` is tracediff's own SIGTERM handler (runner.signals.on_sigterm); `received` gets
    the names of the signals the script's own handlers took."""

    def __init__(self, stop, exit_by_signal, handler, received=None):
        self.stop = stop
        self.exit_by_signal = exit_by_signal
        self.handler = handler
        self.received = [] if received is None else received
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
            previous = _real_set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            r.close()
            w.close()
            return self
        if previous != -1:           # the caller's own (an event loop): leave it theirs
            _real_set_wakeup_fd(previous)
            r.close()
            w.close()
            return self
        taken.clear()
        self.pid = os.getpid()
        self.sockets = (r, w)
        self.ids = (descriptor_identity(r.fileno()), descriptor_identity(w.fileno()))
        for sock in (r, w):
            reserve_descriptor(sock.fileno())
        _active.append(w.fileno())
        signal.set_wakeup_fd = self._set_wakeup_fd
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
        signal.set_wakeup_fd = _real_set_wakeup_fd
        try:
            mine = _real_set_wakeup_fd(-1)
            if mine != w.fileno():          # the script set its own since: put it back
                _real_set_wakeup_fd(mine)
        except (ValueError, OSError):
            pass
        for sock in (r, w):
            release_descriptor(sock.fileno())
        # a script that closed every descriptor (os.closerange) may hold these numbers
        # for its own files now: never shut down or close what is no longer ours
        ours = [descriptor_identity(x.fileno()) == i for x, i in zip((r, w), self.ids)]
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

    def _set_wakeup_fd(self, fd, /, **kwargs):
        """`signal.set_wakeup_fd` as the script sees it while recorded: ours reads as -1
        (none), and setting -1 gives the wakeup back to the watch."""
        ours = self.sockets[1].fileno() if self.sockets and os.getpid() == self.pid else None
        if fd == -1 and ours is not None:
            previous = _real_set_wakeup_fd(ours, warn_on_full_buffer=False)
        else:
            previous = _real_set_wakeup_fd(fd, **kwargs)
        return -1 if previous == ours and ours is not None else previous

    def _ours(self):
        """SIGTERM's handler is still tracediff's: the script installed none, ignores it not."""
        return installed_handler(signal.SIGTERM) is self.handler

    def _watch(self):
        r = self.sockets[0]
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            if os.getpid() != self.pid:
                continue
            self._note_the_scripts(data)
            if signal.SIGTERM not in data or not self._ours():
                continue            # the script's own handler decides how the run ends
            if taken.wait(GRACE):
                return              # the main thread took it: it closes the trace
            if not self._ours():
                continue            # the script put in its own meanwhile: its call
            self._end()
            return

    def _note_the_scripts(self, data):
        for sig in ENDING:
            if sig not in data:
                continue
            handler = installed_handler(sig)
            name = signal.Signals(sig).name
            if callable(handler) and handler not in (self.handler, signal.default_int_handler) \
                    and name not in self.received:
                self.received.append(name)

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


def descriptor_identity(fd):
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
        fd = _real_set_wakeup_fd(-1)
        if fd != _active[-1]:
            _real_set_wakeup_fd(fd)
    except (ValueError, OSError):
        pass
    _active.clear()
