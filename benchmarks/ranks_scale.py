"""`tracediff locate DIR DIR` and `tracediff replicas DIR` over many ranks: time vs workers.

Real recordings: the 4-rank gloo DDP fixture (fixtures/torch_ddp.py) is recorded once
clean and once with rank 2's gradient perturbed (`python -m torch.distributed.run
--nproc-per-node 4 -m tracediff record -o DIR/`); an N-rank run is then made by copying
rank r % 4 of each run to rank r and rewriting the rank and world size in the copy's
manifest (h5py), so every pair is a real recording with the real work of one pair.
Each configuration is timed once, in one session, in a fresh `python -m tracediff`
process (start-up included, as a user pays it).

    python benchmarks/ranks_scale.py --pairs 8 64 --workers 1 2 4 [--dask 2] \
        [--steps 20 --width 256]   # the recorded runs: 20 steps, 256 hidden units
    python benchmarks/ranks_scale.py --from DIR   # reuse DIR/clean, DIR/faulty (4 ranks)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "fixtures", "torch_ddp.py")
sys.path.insert(0, ROOT)   # the in-process Dask scheduler unpickles tracediff's tasks


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    e["PYTHONPATH"] = ROOT
    e.pop("XLA_FLAGS", None)
    return e


def record(folder, script_args):
    """clean/ and faulty/ (4 ranks each), both torchrun jobs at once."""
    procs = []
    for i, (name, extra) in enumerate((("clean", []), ("faulty", ["--fault-rank", "2",
                                                                   "--fault-step", "0"]))):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
             "--master-addr", "127.0.0.1", "--master-port", str(29400 + i),
             "-m", "tracediff", "record", "-o", os.path.join(folder, name) + os.sep,
             SCRIPT, *script_args, *extra], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(err[-3000:])


def make_ranks(src, dst, n):
    """dst/rank{r}.h5 for r < n: a copy of src/rank{r % 4}.h5 with rank r of n."""
    os.makedirs(dst, exist_ok=True)
    for r in range(n):
        out = os.path.join(dst, f"rank{r}.h5")
        shutil.copy(os.path.join(src, f"rank{r % 4}.h5"), out)
        with h5py.File(out, "r+") as f:
            m = json.loads(f["manifest"][()])
            m["distributed"].update(rank=r, world_size=n, local_rank=r)
            f["manifest"][()] = json.dumps(m, sort_keys=True)


def timed(args):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracediff", *args], env=env(),
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(proc.stderr[-3000:])
    return wall, json.loads(proc.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--dask", type=int, default=0, metavar="N",
                    help="also on a Dask LocalCluster of N worker processes")
    ap.add_argument("--from", dest="src", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=256)
    opts = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ranks_scale_")
    src = opts.src or tmp
    if opts.src is None:
        t0 = time.perf_counter()
        record(tmp, ["--steps", str(opts.steps), "--width", str(opts.width)])
        print(f"recorded 2 x 4 ranks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cluster = None
    if opts.dask:
        from distributed import LocalCluster

        os.environ.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")   # the workers' imports
        cluster = LocalCluster(n_workers=opts.dask, threads_per_worker=1,
                               dashboard_address=None)
    print(f"CPUs: {os.cpu_count()}")
    print("| ranks | where | locate DIR DIR (s) | replicas DIR (s) | first rank |")
    print("|---|---|---|---|---|")
    for n in opts.pairs:
        a, b = os.path.join(tmp, f"a{n}"), os.path.join(tmp, f"b{n}")
        make_ranks(os.path.join(src, "clean"), a, n)
        make_ranks(os.path.join(src, "faulty"), b, n)
        places = [(f"--workers {w}", ["--workers", str(w)]) for w in opts.workers]
        if cluster is not None:
            places.append((f"Dask LocalCluster, {opts.dask} processes",
                           ["--scheduler", cluster.scheduler_address]))
        firsts = set()
        for label, extra in places:
            lw, lj = timed(["locate", a, b, "--json", "--no-explain", *extra])
            rw, rj = timed(["replicas", b, "--json", *extra])
            firsts.add((lj["first_rank"], rj["first"]["rank"] if rj["first"] else None))
            print(f"| {n} | {label} | {lw:.2f} | {rw:.2f} | {lj['first_rank']} |", flush=True)
        assert len(firsts) == 1, firsts   # the same answer wherever it ran
    if cluster is not None:
        cluster.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
