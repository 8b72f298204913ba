"""Pairing beyond sequence alignment. Two frameworks (a Flax model and its PyTorch port):
dataflow pairs units (dataflow; its parts: graph and nodes for one side, atoms, modules,
reads) and cross turns them into a Differ (with roles for the optimizer steps, layers for
what a finding names). Eager against torch.compile: compiled (with compiled_values)."""
