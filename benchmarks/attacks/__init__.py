"""The attacks of benchmarks/hostile_round6.py, one module per area: each attack is a
function of a fresh folder returning (held, what was seen)."""

from . import cache, nonfinite, optimizer, signals, sources, stats

AREAS = {"cache": cache.ATTACKS, "sources": sources.ATTACKS, "optimizer": optimizer.ATTACKS,
         "stats": stats.ATTACKS, "signals": signals.ATTACKS, "nonfinite": nonfinite.ATTACKS}
