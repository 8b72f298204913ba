"""Each source's op re-run on its recorded inputs under each setting, one process per
setting (the settings are read when a library loads: ATEN_CPU_CAPABILITY, oneDNN's ISA,
the thread pools, XLA's flags). A setting whose process computes other bits than the
process with the side's own settings, from the same inputs, changes how that op computes:
it is that op's cause, found by experiment.

The ops run through the replay of `explain/replay` (its allow-list, its bounded inputs;
nothing from a trace is executed); the worker is this module run as a script:
`python -m tracediff.diff.confirm.op_runs TRACE EVENT...` prints {event: [sha256 of each
output] or "cannot: why"} as JSON. Ops replay cannot run (an RNG draw) are judged by the
whole runs instead (`measure.at_op`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import subprocess
import sys

from . import settings as _settings
from .runs import default_jobs, env_words


def _digests(trace_path, events) -> dict:
    import numpy as np

    from ...trace.blob import ValueReader
    from ...trace.reader import Trace
    from ..align import sequence as _align
    from ..explain.replay.calls import build_call, recorded_output_size
    from ..explain.replay.params import CannotReplay
    from ..explain.verdict import trace_inputs

    out = {}
    t = Trace(trace_path)
    try:
        side, reader = _align.prepare(t, _align.StringIds()), ValueReader(t)
        for ev in events:
            try:
                e = t.event(ev)
                inputs = trace_inputs(t, side, reader, ev)
                call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                                  recorded_output_size(t, ev))
                outs = call.run(inputs)
                out[str(ev)] = [hashlib.sha256(np.ascontiguousarray(o).tobytes()).hexdigest()
                                [:16] for o in outs]
            except CannotReplay as exc:
                out[str(ev)] = f"cannot: {exc}"
            except Exception as exc:   # the op failed here: no bits to compare
                out[str(ev)] = f"cannot: {type(exc).__name__}: {exc}"
    finally:
        t.close()
    return out


def _words(env_side, revert, trace_path, events):
    return env_words(env_side, revert) + [
        sys.executable, "-m", "tracediff.diff.confirm.op_runs", trace_path, *map(str, events)]


def _run(words):
    try:
        p = subprocess.run(words, capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
        return json.loads(p.stdout.decode() or "{}") if p.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def causes(ta, tb, found, pairs, jobs=None) -> dict:
    """{a event: [Setting]} for the (a event, b event) pairs whose op could be re-run here:
    the settings that change the op's bits when set as on the other side, on a's inputs
    (a's settings, then each as on b) or on b's inputs (b's settings, then each as on a).
    An event whose op could not be re-run is absent."""
    env_a, env_b = _settings.env_of(ta.manifest), _settings.env_of(tb.manifest)
    ev_a = sorted({ea for ea, _ in pairs})
    ev_b = sorted({eb for _, eb in pairs})
    env_settings = [s for s in found if s.kind != "argv"]
    jobs_words = {("a", None): _words(env_a, [], ta.path, ev_a),
                  ("b", None): _words(env_b, [], tb.path, ev_b)}
    for s in env_settings:
        jobs_words[("a", s.label)] = _words(env_a, [_settings.swapped(s)], ta.path, ev_a)
        jobs_words[("b", s.label)] = _words(env_b, [s], tb.path, ev_b)
    jobs = jobs or default_jobs()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        got = dict(zip(jobs_words, pool.map(_run, jobs_words.values())))
    out = {}
    for ea, eb in pairs:
        if not isinstance(got[("a", None)].get(str(ea)), list):
            continue   # not re-run here (not replayable, or its process failed)
        mine = []
        for s in env_settings:
            for side, ev in (("a", ea), ("b", eb)):
                base, flipped = got[(side, None)].get(str(ev)), got[(side, s.label)].get(str(ev))
                if isinstance(base, list) and isinstance(flipped, list) and base != flipped:
                    mine.append(s)
                    break
        out[ea] = mine
    return out


if __name__ == "__main__":   # the worker: one process, this environment
    print(json.dumps(_digests(sys.argv[1], [int(x) for x in sys.argv[2:]])))
