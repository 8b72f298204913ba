"""Root cause of a divergence (`tracediff explain`): replay on this machine (replay,
verdict), how each side computed its value (mechanisms), the dataflow chain (chain), the
environment (env, causes), divergence over steps (steps), a reproducer (repro), and
analysis, which puts them together."""
