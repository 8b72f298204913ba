"""PyTorch capture (placeholder docstring, rewritten below once the modules are split)."""
