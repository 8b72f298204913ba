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
  cluster (`pip install 'tracediff-ml[dask]'`); `workers` is then ignored. Connecting,
  the scheduler's handshake included, is bounded (`CONNECT_S`). The scheduler is trusted
  code: Dask's protocol carries pickles both ways (docs/distributed.md).
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ...errors import TraceError


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


CONNECT_S = 20.0   # seconds to connect to a scheduler and hear its handshake


def _dask(fn, jobs, scheduler):
    try:
        from distributed import Client
    except ImportError:
        raise TraceError("--scheduler needs Dask distributed: pip install "
                         "'tracediff-ml[dask]'") from None
    try:
        if isinstance(scheduler, Client):
            return scheduler.gather(scheduler.map(fn, *zip(*jobs), pure=False))
        return _on_own_loop(_dask_address(Client, fn, jobs, scheduler))
    except TraceError:
        raise
    except Exception as exc:   # the cluster's own failure: say what usually causes it
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise TraceError(f"the Dask cluster {scheduler} failed: {msg} (the scheduler and "
                         f"every worker need tracediff-ml installed, and the workers must "
                         f"see the trace paths)") from None


async def _dask_address(Client, fn, jobs, address):
    """Connect to `address` within CONNECT_S seconds, handshake included (Dask's own
    timeout covers the TCP connect, not the scheduler's answer: a server that accepts and
    never answers would hold the client forever), then run the jobs there."""
    import asyncio

    client = Client(address, timeout=f"{CONNECT_S}s", asynchronous=True)
    try:
        await asyncio.wait_for(client, CONNECT_S)
    except BaseException as exc:
        try:
            await asyncio.wait_for(client.close(), CONNECT_S)
        except BaseException:
            pass
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            raise TraceError(f"cannot reach the Dask scheduler {address}: no answer within "
                             f"{CONNECT_S:g} s") from None
        if isinstance(exc, (OSError, ValueError)):
            raise TraceError(f"cannot reach the Dask scheduler {address}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
                             ) from None
        raise
    try:
        return await client.gather(client.map(fn, *zip(*jobs), pure=False))
    finally:
        try:
            await asyncio.wait_for(client.close(), CONNECT_S)
        except Exception:
            pass


def _on_own_loop(coro):
    """Run `coro` to its end on a new event loop in a thread of its own (the caller may
    already run a loop: a notebook), returning its result or raising its exception."""
    import asyncio
    import threading

    box = {}

    def main():
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=main, name="tracediff-dask", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
