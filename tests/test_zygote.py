"""The tests' warm process (tests/zygote.py, tests/helpers.Zygote): every job gets its
answer, whatever order replies arrive in and however jobs and replies interleave; a job
runs with the resource limits it asks for."""

import array
import fcntl
import socket
import termios
import time

import pytest

from .helpers import Zygote


def test_replies_read_ahead_are_kept_when_a_job_is_sent(tmp_path):
    """Two jobs end before their replies are read: the first read takes both replies off
    the socket, and sending a third job must not drop the second's (a text file open for
    reading and writing drops what it read ahead whenever it writes)."""
    script = tmp_path / "job.py"
    script.write_text("import sys\nimport jax\nprint('job', sys.argv[1])\nsys.exit(int(sys.argv[1]))\n")
    z = Zygote("jax")
    z.sock.settimeout(60)   # a lost reply fails here instead of hanging the run
    try:
        first, second = z.start([script, "3"]), z.start([script, "4"])
        for _ in range(6000):   # until both replies wait on the socket, unread (never a hang)
            if _replies_waiting(z.sock) >= 2:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the two replies never waited on the socket together")
        done = z.finish(first)
        third = z.start([script, "5"])
        assert (done.returncode, done.stdout) == (3, "job 3\n")
        for job, code in ((second, 4), (third, 5)):
            proc = z.finish(job)
            assert (proc.returncode, proc.stdout) == (code, f"job {code}\n")
    finally:
        z.close()


def _replies_waiting(sock):
    """How many replies are queued on the socket, unread: the newlines a peek sees, or 2
    once more bytes are queued than the first reply holds (a sandbox's peek may return
    only the first write; suspected, not seen, where this wait did not end under gVisor)."""
    head = sock.recv(1 << 16, socket.MSG_PEEK)
    if head.count(b"\n") != 1:
        return head.count(b"\n")
    queued = array.array("i", [0])
    fcntl.ioctl(sock, termios.FIONREAD, queued)
    return 2 if queued[0] > head.index(b"\n") + 1 else 1


def test_a_job_runs_under_the_limits_it_asks_for(tmp_path):
    script = tmp_path / "limits.py"
    script.write_text("import resource, signal\nimport jax\n"
                      "print(resource.getrlimit(resource.RLIMIT_FSIZE)[0],"
                      " signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN)\n")
    z = Zygote("jax")
    try:
        proc = z.run([script], rlimits={"RLIMIT_FSIZE": 1 << 20}, ignore_signals=["SIGXFSZ"])
        assert (proc.returncode, proc.stdout) == (0, f"{1 << 20} True\n"), proc.stderr
        proc = z.run([script])
        assert proc.stdout != f"{1 << 20} True\n"
    finally:
        z.close()
