"""Where per-rank work runs: in this process, on a local process pool, or on a Dask cluster.

`run(fn, jobs, workers, scheduler)` calls `fn(*job)` for every job and returns the results
in job order, however they ran. A job holds file paths and options, never trace bytes:
each task opens its own files where they live (a Dask worker reads them from its file
system, which must see the same paths as the client, e.g. a shared project directory).
`fn` must be a module-level function (it is pickled by name).

- `workers=1`: in this process, one job after the other.
- `workers=N` (N > 1) or None (min(jobs, CPUs)): a `ProcessPoolExecutor` with the
  `forkserver` start method (safe in a process that has threads; the server has imported
  tracediff once).
- `scheduler="tcp://host:8786"` (or a `distributed.Client`): `client.map` on that Dask
  cluster (`pip install 'tracediff-ml[dask]'`); `workers` is then ignored.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ..errors import TraceError


def default_workers(n_jobs: int) -> int:
    return max(1, min(n_jobs, os.cpu_count() or 1))


def run(fn: Callable, jobs: Sequence[tuple], workers: Optional[int] = None,
        scheduler=None) -> list:
    """[fn(*job) for job in jobs], run where the arguments say (module docstring)."""
    jobs = list(jobs)
    if not jobs:
        return []
    if scheduler is not None:
        return _dask(fn, jobs, scheduler)
    if workers is not None and workers < 1:
        raise TraceError(f"--workers must be at least 1 (got {workers})")
    n = default_workers(len(jobs)) if workers is None else min(workers, len(jobs))
    if n == 1:
        return [fn(*job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([fn.__module__])
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        return list(pool.map(fn, *zip(*jobs)))


def _dask(fn, jobs, scheduler):
    try:
        from distributed import Client
    except ImportError:
        raise TraceError("--scheduler needs Dask distributed: pip install "
                         "'tracediff-ml[dask]'") from None
    own = None
    if isinstance(scheduler, Client):
        client = scheduler
    else:
        try:
            client = own = Client(scheduler, timeout="20s")
        except (OSError, ValueError, TimeoutError) as exc:
            raise TraceError(f"cannot reach the Dask scheduler {scheduler}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
                             ) from None
    try:
        futures = client.map(fn, *zip(*jobs), pure=False)
        return client.gather(futures)
    except TraceError:
        raise
    except Exception as exc:   # the cluster's own failure: say what usually causes it
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise TraceError(f"the Dask cluster {scheduler} failed: {msg} (the scheduler and "
                         f"every worker need tracediff-ml installed, and the workers must "
                         f"see the trace paths)") from None
    finally:
        if own is not None:
            own.close()
