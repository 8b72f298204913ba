"""Where a recording writes, settled before the script runs: the rank of this process
when a launcher (torchrun, jax, MPI, SLURM) started several, the file that rank writes
(one per rank, never shared), and the checks that refuse an output the trace could not
be written to (no folder, not writable, too little free space).
"""

import os
import shutil
import tempfile

from ..errors import TraceError


def min_free_bytes():
    """Free space an output folder needs before a recording starts: TRACEDIFF_MIN_FREE_MB
    (default 64), read when a recording starts, not when tracediff is imported."""
    value = os.environ.get("TRACEDIFF_MIN_FREE_MB", "64")
    try:
        return int(float(value) * (1 << 20))
    except (ValueError, OverflowError):
        raise TraceError(f"TRACEDIFF_MIN_FREE_MB must be a number of MiB, not {value!r}") from None

# (rank, local rank, world size) variables of the launchers we know, in order of trust.
RANK_ENV = [("RANK", "LOCAL_RANK", "WORLD_SIZE", "torchrun"),
            ("JAX_PROCESS_ID", None, "JAX_NUM_PROCESSES", "jax"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"),
            ("PMI_RANK", None, "PMI_SIZE", "mpich"),
            ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "slurm")]


def distributed_rank(environ=None):
    """{"rank", "local_rank", "world_size", "launcher"} when this process is one of several
    started by torchrun / jax / MPI / SLURM (world size > 1), else None."""
    env = os.environ if environ is None else environ
    for rank_var, local_var, size_var, launcher in RANK_ENV:
        try:
            rank, size = int(env[rank_var]), int(env[size_var])
        except (KeyError, ValueError):
            continue
        if size > 1 and 0 <= rank < size:
            try:
                local = int(env[local_var]) if local_var else None
            except (KeyError, ValueError):
                local = None
            return {"rank": rank, "local_rank": local, "world_size": size, "launcher": launcher}
    return None


def output_path_for(output, environ=None):
    """The file a recording writes. A directory (`-o run_a/`: a trailing slash, or an
    existing directory) gets `rank{R}.h5` for rank R of a multi-process run and
    `trace.h5` otherwise (created if missing); a file name gets `.rank{R}` inserted before
    its extension for rank R (`run_a.h5` -> `run_a.rank2.h5`). Every rank gets its own
    trace; they never share a file."""
    dist = distributed_rank(environ)
    output = os.fspath(output)
    if output.endswith(("/", os.sep)) or os.path.isdir(output):
        try:
            os.makedirs(output, exist_ok=True)   # every rank may race here
        except OSError as exc:
            raise TraceError(f"cannot write into {output}: {exc.strerror or exc}") from None
        name = "trace.h5" if dist is None else f"rank{dist['rank']}.h5"
        return os.path.join(output, name)
    if dist is None:
        return output
    root, ext = os.path.splitext(output)
    return f"{root}.rank{dist['rank']}{ext or '.h5'}"


def check_output_path(output):
    """Refuse, before the script runs, an output the trace could not be written to."""
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if not os.path.isdir(folder):
        raise TraceError(f"cannot write {output}: folder {folder} does not exist")
    if os.path.isdir(output):
        raise TraceError(f"cannot write {output}: it is a directory")
    if os.path.exists(output) and not os.path.isfile(output):
        raise TraceError(f"cannot write {output}: not a regular file")
    # A real probe: os.access says yes to root on a read-only file system.
    try:
        fd, probe = tempfile.mkstemp(prefix=".tracediff-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise TraceError(f"cannot write {output}: folder {folder} is not writable "
                         f"({exc.strerror or exc})") from None
    if os.path.exists(output) and not os.access(output, os.W_OK):
        raise TraceError(f"cannot write {output}: the file exists and is not writable")
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    need = min_free_bytes()
    if free is not None and free < need:
        raise TraceError(f"cannot write {output}: only {free / (1 << 20):.0f} MiB free in {folder} "
                         f"(need {need >> 20} MiB; set TRACEDIFF_MIN_FREE_MB to change)")
