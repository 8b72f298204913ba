"""Diff two traces, as a pipeline (docs/architecture.md): compare values (compare/), pair
events (align/, and pairing/ across frameworks or eager against torch.compile), search the
first divergence (differ.py with its parts in engine/), explain it (explain/), many ranks
(distributed/); locate.py is the entry point, result/ the types every caller gets."""
