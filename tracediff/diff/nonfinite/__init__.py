"""Where a trace's NaN and Inf values came from: the first op that made them from finite
inputs and whose values the run kept (`find_nonfinite`, `tracediff info`), across the
ranks of one run (`find_nonfinite_ranks`).

counts.py: each value's NaN and Inf counts (bytes or statistics); graph.py: the
non-finite part of the dataflow, its roots and what each reaches; mechanism.py: how an op
made them, in words; origin.py: the `NonFinite` result.
"""

from .origin import find_nonfinite, find_nonfinite_ranks

__all__ = ["find_nonfinite", "find_nonfinite_ranks"]
