"""An in-process stack sampler for machines where py-spy cannot attach (the TPU host: its
user may not ptrace). Put this folder first on PYTHONPATH and set SAMPLE_OUT=PATH: every
SAMPLE_MS milliseconds (default 10) a daemon thread takes every thread's stack and writes,
every 2 s and at exit, PATH.<pid> with collapsed stacks ("thread;frame;frame count") and,
after a "#TIMELINE" line, the main thread's innermost tracediff frame and leaf frame at each
sample ("seconds frame | leaf"). `python benchmarks/stack_waits.py PATH.<pid>` reads it.
Sampling takes the GIL, so it counts Python and waits in native code (XLA compiles) alike.

    PYTHONPATH=benchmarks/stack_sampler:$PYTHONPATH SAMPLE_OUT=/tmp/s \\
        python -m tracediff record --level stats -o t.h5 fixtures/jax_mlp.py
"""

import os

if os.environ.get("SAMPLE_OUT"):
    import atexit
    import collections
    import sys
    import threading
    import time

    _OUT = f"{os.environ['SAMPLE_OUT']}.{os.getpid()}"
    _EVERY = float(os.environ.get("SAMPLE_MS", "10")) / 1000
    _counts = collections.Counter()
    _timeline = []
    _t0 = time.perf_counter()
    _main = threading.main_thread().ident

    def _name(frame):
        code = frame.f_code
        path = code.co_filename
        for cut, prefix in (("/tracediff/", "td/"), ("site-packages/", ""), ("lib/python3", "")):
            at = path.find(cut)
            if at >= 0:
                path = prefix + path[at + len(cut):]
                break
        return f"{path}:{code.co_name}:{frame.f_lineno}"

    def _dump():
        with open(_OUT + ".tmp", "w") as f:
            for stack, n in _counts.most_common():
                f.write(f"{stack} {n}\n")
            f.write("#TIMELINE\n")
            for t, where in _timeline:
                f.write(f"{t:.2f} {where}\n")
        os.replace(_OUT + ".tmp", _OUT)

    def _sample():
        me, names, last = threading.get_ident(), {}, time.perf_counter()
        while True:
            time.sleep(_EVERY)
            now = time.perf_counter()
            names.update((t.ident, t.name.split("_")[0]) for t in threading.enumerate())
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = []
                while frame is not None:
                    stack.append(_name(frame))
                    frame = frame.f_back
                stack.reverse()
                thread = "main" if tid == _main else names.get(tid, "?")
                _counts[thread + ";" + ";".join(stack)] += 1
                if tid == _main and len(_timeline) < 200_000:
                    ours = [s for s in stack if s.startswith("td/")]
                    _timeline.append((now - _t0, (ours[-1] if ours else "") + " | " + stack[-1]))
            if now - last > 2:
                last = now
                try:
                    _dump()
                except OSError:
                    pass

    threading.Thread(target=_sample, daemon=True, name="stack-sampler").start()
    atexit.register(_dump)
