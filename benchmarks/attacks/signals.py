"""How a recorded program ends when it forks and is terminated: as the plain one."""

from .runs import both, same

TERM = """
import atexit, os, sys, threading, time
feature = sys.argv[1]
if feature == "atexit":
    atexit.register(lambda: print("atexit ran", flush=True))
if feature == "thread":
    threading.Thread(target=lambda: (time.sleep(1), print("thread ran", flush=True))).start()
if feature == "handler":
    import signal
    signal.signal(signal.SIGTERM, lambda s, f: (print("own handler", flush=True), sys.exit(3)))
print("buffered", end="")          # block-buffered to a pipe: lost at SIGTERM's default
try:
    open("ready", "w").close()
    for _ in range(3000):
        time.sleep(0.01)
except BaseException:
    if feature == "except":
        print("caught", flush=True)
finally:
    if feature == "finally":
        print("finally ran", flush=True)
"""

FORK = """
import multiprocessing as mp, os, sys, time

def work(i):
    time.sleep(5)
    return i

if __name__ == "__main__":
    pool = mp.get_context("fork").Pool(2)
    r = pool.map_async(work, range(4))
    time.sleep(0.5)
    if sys.argv[1] == "terminate":
        pool.terminate()
    else:
        for p in pool._pool:
            os.kill(p.pid, 15)
        pool.terminate()
    pool.join()
    print("pool ended", flush=True)
"""


def _term(feature):
    def attack(work):
        return same(both(work, TERM, feature, sigterm=True))
    return attack


def _fork(how):
    def attack(work):
        got = both(work, FORK, how)
        held, seen = same(got)
        clean = "Traceback" not in got["recorded_stderr"]
        return held and clean, seen + ("" if clean else "; a traceback on stderr")
    return attack


ATTACKS = [(f"SIGTERM with {f}", _term(f)) for f in ("atexit", "thread", "finally", "except",
                                                     "handler", "plain")] + [
    ("a fork Pool terminated mid-task", _fork("terminate")),
    ("a fork Pool's workers sent SIGTERM", _fork("kill")),
]
