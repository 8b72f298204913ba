"""Trace sizes: small scripts (compaction of finished traces) and a slice of a big one.

    python benchmarks/trace_size.py [--out DIR]

Records fixtures/torch_dot.py, the GRU example (1 step) and a tiny GPT-2 trained 3 steps
(benchmarks/gpt2_train.py, needs transformers), then slices the GPT-2 trace around an
addmm of the last step's forward with --hops 2. Prints one table (docs/performance.md,
"Trace sizes")."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def record(out, script, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", out, script, *args],
                   env=env, check=True, capture_output=True)
    return os.path.getsize(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    folder = p.parse_args().out or tempfile.mkdtemp()
    sys.path.insert(0, ROOT)
    import tracediff
    from tracediff.trace.slice import write_slice

    rows = []
    for name, script, args in (("torch_dot.py (3 ops)", "fixtures/torch_dot.py", ()),
                               ("jax_gru_expm_adam.py --steps 1", "fixtures/jax_gru_expm_adam.py",
                                ("--steps", "1")),
                               ("tiny GPT-2, 3 AdamW steps", "benchmarks/gpt2_train.py", ())):
        out = os.path.join(folder, os.path.basename(script) + ".h5")
        size = record(out, os.path.join(ROOT, script), *args)
        with tracediff.load(out) as t:
            n = len(t)
        rows.append((name, n, size))
        if "GPT-2" in name:
            with tracediff.load(out) as t:
                mm = [t.event(i) for i in range(len(t))]
                mm = [e for e in mm if e["op"].startswith("aten::addmm") and e["phase"] == "forward"]
                last = max(e["step"] for e in mm)
                ids = [e["index"] for e in mm if e["step"] == last]
            around = ids[len(ids) // 2]
            info = write_slice(out, around, out + ".slice.h5", hops=2, force=True)
            rows.append((f"  slice --around {around} (aten::addmm) --hops 2", info["events"],
                         info["size"]))
    print(f"{'trace':52} {'events':>8} {'bytes':>12}")
    for name, n, size in rows:
        print(f"{name:52} {n:>8} {size:>12,}")


if __name__ == "__main__":
    main()
