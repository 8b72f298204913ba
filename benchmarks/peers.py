"""tracediff against its peers on the same torch workloads, machine and run.

Peers (installed from PyPI into a separate venv, see docs/performance.md):
  debugmode   torch.utils._debug_mode.DebugMode with log_tensor_hashes() (aten level,
              float64 hash per output, in memory only)
  ms_stat     mindstudio-probe (msprobe) PrecisionDebugger, task statistics, level L1
  ms_md5      the same with summary_mode md5 (CRC-32 per tensor)
  ms_tensor   msprobe task tensor, level L1 (every API's inputs and outputs as .pt files;
              on the MLP only step 0 is dumped: 2 GB per step)
  torchlens   torchlens.trace per step with layers_to_save="all", save_grads=True, then
              trace.backward(loss) and an ordinary optimizer step (kept in memory)
and tracediff record at --level calls / stats / full (full on the MLP: one step, --steps 0:1).

Workloads: gru (GRUCell(8,32) + Linear(32,4), seq 5, batch 16, Adam, 100 steps) and mlp
(1024-4096-4096-1024, batch 64, MSE, Adam lr 1e-4, 20 steps). Every run is a fresh process
that times its training loop (CPU seconds of the loop, `time.process_time`) and prints a
SHA-1 of the final parameters, so we can tell whether a recorder changed the result.

    python benchmarks/peers.py [--peers-python .venv-peers/bin/python] [--only gru]

`--one-process`: torch's own DebugMode (op log alone, then with `log_tensor_hashes`)
against tracediff's calls / stats / full (`tracediff.record`) on the same GRU loop in this
one process, in rounds that alternate the recorders (the machine may be shared), median
loop CPU seconds of `--repeat` rounds; no peers venv needed (DebugMode ships with torch).

    python benchmarks/peers.py --one-process [--repeat 5] [--steps 100]
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child import run_timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- child: one workload under one recorder --------------------------------------------------

def _models(name):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "gru":
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = nn.GRUCell(8, 32)
                self.out = nn.Linear(32, 4)

            def forward(self, xs):
                h = torch.zeros(xs.shape[1], 32)
                for x in xs:
                    h = self.gru(x, h)
                return self.out(h)

        model = M()
        data = (torch.randn(5, 16, 8), torch.randn(16, 4))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return model, data, opt, 100
    sizes = [1024, 4096, 4096, 1024]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    data = (torch.randn(64, 1024), torch.randn(64, 1024))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, data, opt, 20


def child(workload, recorder, out):
    import torch
    from torch import nn

    model, (x, y), opt, steps = _models(workload)
    if os.environ.get("BENCH_STEPS"):
        steps = int(os.environ["BENCH_STEPS"])

    class WithLoss(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, y):
            return nn.functional.mse_loss(self.m(x), y)

    wl = WithLoss(model)
    records = 0
    dbg = dm = None
    if recorder.startswith("ms_"):
        from msprobe.pytorch import PrecisionDebugger

        task = "tensor" if recorder == "ms_tensor" else "statistics"
        cfg = {"task": task, "dump_path": out, "rank": [], "level": "L1",
               "step": [0] if (recorder == "ms_tensor" and workload == "mlp") else [],
               task: {"scope": [], "list": [], "data_mode": ["all"]}}
        if task == "statistics":
            cfg[task]["summary_mode"] = "md5" if recorder == "ms_md5" else "statistics"
        path = os.path.join(out, "config.json")
        with open(path, "w") as fh:
            json.dump(cfg, fh)
        dbg = PrecisionDebugger(config_path=path)
    t0 = time.process_time()
    if recorder == "debugmode":
        from torch.utils._debug_mode import DebugMode

        dm = DebugMode(record_nn_module=True)
        ctx_hash = DebugMode.log_tensor_hashes()
        dm.__enter__()
        ctx_hash.__enter__()
    for step in range(steps):
        opt.zero_grad()
        if recorder == "torchlens":
            import torchlens as tl
            from torchlens.options import CaptureOptions

            tr = tl.trace(wl, (x, y), capture=CaptureOptions(layers_to_save="all",
                                                            save_grads=True,
                                                            backward_ready=True,
                                                            detach_saved_activations=False))
            loss = tr[tr.output_layers[0]].out
            tr.backward(loss)
            records += len(getattr(tr, "layer_list", []) or [])
            del tr
        else:
            if dbg is not None:
                dbg.start(wl)
            loss = wl(x, y)
            loss.backward()
        opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
    if dm is not None:
        ctx_hash.__exit__(None, None, None)
        dm.__exit__(None, None, None)
        records = len(dm.logs)
    loop = time.process_time() - t0
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    import resource as _r

    print(json.dumps({"loop_s": loop, "params_sha1": h.hexdigest(), "records": records,
                      "loss": float(loss), "rss_mb": _r.getrusage(_r.RUSAGE_SELF).ru_maxrss / 1024}))


# -- one process: DebugMode against tracediff, alternating ------------------------------------

ONE_PROCESS = ("none", "debugmode log", "debugmode hashes", "td_calls", "td_stats", "td_full")


def _gru_loop(steps, recorder, folder):
    """The GRU + Adam loop of `child`, from seed 0, under one recorder: (loop CPU s,
    records, SHA-1 of the trained parameters)."""
    import contextlib

    import torch

    model, (xs, y), opt, _ = _models("gru")
    records = None
    if recorder.startswith("debugmode"):
        from torch.utils._debug_mode import DebugMode

        dm = DebugMode(record_nn_module=True)
        ctx = contextlib.ExitStack()
        ctx.enter_context(dm)
        if recorder == "debugmode hashes":
            ctx.enter_context(DebugMode.log_tensor_hashes())
    elif recorder.startswith("td_"):
        import tracediff

        trace = os.path.join(folder, f"{recorder}.h5")
        ctx = tracediff.record(trace, level=recorder[3:], frameworks=("torch",))
    else:
        ctx = contextlib.nullcontext()
    with ctx:   # the loop alone is timed: not the recorder's start and close
        t0 = time.process_time()
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs), y)
            loss.backward()
            opt.step()
        loop = time.process_time() - t0
    if recorder.startswith("debugmode"):
        records = len(dm.logs)
    elif recorder.startswith("td_"):
        import tracediff

        with tracediff.load(trace) as t:
            records = len(t)
        os.unlink(trace)
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return loop, records, h.hexdigest()


def one_process(steps, repeat):
    """Print the table of DebugMode's modes against tracediff's levels, one process."""
    import statistics

    import torch

    torch.set_num_threads(1)
    loops = {r: [] for r in ONE_PROCESS}
    facts = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        _gru_loop(3, "none", folder)   # warm-up: imports, allocator, first-call caches
        for _ in range(repeat):
            for rec in ONE_PROCESS:
                loop, records, sha = _gru_loop(steps, rec, folder)
                loops[rec].append(loop)
                facts[rec] = (records, sha)
    base = statistics.median(loops["none"])
    print(f"GRU + Adam, {steps} steps, one process, {repeat} alternating rounds, "
          f"torch threads 1; load average at end {os.getloadavg()}")
    print("| recorder | loop CPU s (median) | × plain | rounds (s) | records | params = plain |")
    print("|---|---:|---:|---|---:|---|")
    names = {"none": "plain", "debugmode log": "DebugMode, op log",
             "debugmode hashes": "DebugMode + log_tensor_hashes", "td_calls": "tracediff calls",
             "td_stats": "tracediff stats", "td_full": "tracediff full"}
    for rec in ONE_PROCESS:
        m = statistics.median(loops[rec])
        records, sha = facts[rec]
        same = "yes" if sha == facts["none"][1] else "**no**"
        print(f"| {names[rec]} | {m:.2f} | {m / base:.1f}x | "
              f"{' '.join(f'{x:.2f}' for x in loops[rec])} | "
              f"{'' if records is None else f'{records:,}'} | {same} |", flush=True)
    ratios = [s / f for s, f in zip(loops["td_stats"], loops["td_full"])]
    print(f"tracediff stats / full, per round: {' '.join(f'{r:.2f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.2f})")


# -- parent ---------------------------------------------------------------------------------

def du(path):
    total, files = 0, 0
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not n.endswith(".json") or n.startswith("dump"):
                total += os.path.getsize(p)
                files += 1
    return total, files


def run(cmd, env):
    proc, wall, cpu = run_timed(cmd, env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:200] if proc.stderr else "failed",
                "wall": wall, "cpu": cpu}
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    res = json.loads(line)
    res.update(wall=wall, cpu=cpu)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=3, metavar=("WORKLOAD", "RECORDER", "OUT"))
    ap.add_argument("--peers-python", default=".venv-peers/bin/python")
    ap.add_argument("--only", default="gru,mlp")
    ap.add_argument("--recorders", default="none,debugmode,ms_stat,ms_md5,ms_tensor,torchlens,"
                                           "td_calls,td_stats,td_full")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--one-process", action="store_true",
                    help="DebugMode's modes against tracediff's levels in this one process")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of --one-process")
    ap.add_argument("--steps", type=int, default=100, help="GRU steps of --one-process")
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    if args.one_process:
        if args.threads:
            os.environ["OMP_NUM_THREADS"] = args.threads
        return one_process(args.steps, args.repeat)
    env = dict(os.environ, PYTHONPATH=ROOT)
    if args.threads:
        env["OMP_NUM_THREADS"] = args.threads
    me = os.path.abspath(__file__)
    print(f"load average at start: {os.getloadavg()}, OMP_NUM_THREADS={args.threads or 'default'}")
    print("| workload | recorder | loop CPU s | × plain | process wall s | process CPU s | "
          "records/events | dump MB | files | peak RSS MB | params = plain |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for workload in args.only.split(","):
        base = None
        for rec in args.recorders.split(","):
            out = tempfile.mkdtemp(prefix=f"peers-{workload}-{rec}-", dir="/tmp")
            try:
                if rec.startswith("td_"):
                    level = rec[3:]
                    opts = ["--level", level]
                    if level == "full" and workload == "mlp":
                        opts += ["--steps", "0:1"]
                    trace = os.path.join(out, "t.h5")
                    res = run([sys.executable, "-m", "tracediff", "record", "-o", trace, *opts,
                               me, "--child", workload, "none", out], env)
                    if "error" not in res:
                        import tracediff

                        with tracediff.load(trace) as t:
                            res["records"] = len(t)
                elif rec == "none":
                    res = run([sys.executable, me, "--child", workload, "none", out], env)
                else:
                    res = run([args.peers_python, me, "--child", workload, rec, out], env)
                size, files = du(out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            if "error" in res:
                print(f"| {workload} | {rec} | failed: {res['error']} | | | | | | | | |",
                      flush=True)
                continue
            if rec == "none":
                base = res
            ratio = res["loop_s"] / base["loop_s"] if base else float("nan")
            same = "yes" if base and res["params_sha1"] == base["params_sha1"] else "**no**"
            print(f"| {workload} | {rec} | {res['loop_s']:.2f} | {ratio:.1f}x | {res['wall']:.1f} | "
                  f"{res['cpu']:.1f} | {res['records']:,} | {size / 1e6:.1f} | {files} | "
                  f"{res['rss_mb']:.0f} | {same} |", flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
