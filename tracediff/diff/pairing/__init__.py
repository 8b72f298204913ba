"""Pairing beyond sequence alignment: two frameworks (dataflow pairs, cross: a Flax model
and its PyTorch port) and eager against torch.compile (compiled)."""
