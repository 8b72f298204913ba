"""Many traces of one run: per-rank comparison of two runs (ranks), replicas that must
agree within one run (replicas), and where the per-rank work runs (pool)."""
