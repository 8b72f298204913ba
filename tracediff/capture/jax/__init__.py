"""The JAX capture: how tracediff observes a JAX/Flax/optax program (`recorder.JaxCapture`).

Importing this package imports nothing of JAX: `capture.start_captures` imports
`recorder` only once the script has imported `jax`. Every module here imports the real
JAX absolutely (`import jax`); this package's own name never stands for it (and
capture/__init__.py imports no `jax` of its own: once this package is imported, the name
`jax` in capture's namespace is this package). The modules,
by concern: `recorder` (the capture itself, installed and uninstalled, and its manifest)
built from `dispatch` (the hooks JAX calls: jit calls and eager primitives), `light_calls`
(a call recorded by its inputs and outputs only: `--level calls`, outside a `--steps`
window), `replay` (the jaxpr interpreter) and `sites` (what an equation is, once),
`value_store` (values written, hashed where they are), `naming` (source lines, name
stacks, NNX paths), `optimizer` (optax steps) and `devices` (shards, per-device bodies,
processes); then the helpers they use: `probe` (compiled values of a call's equations),
`fastjit` (JAX's C++ fast path kept at `--level calls`), `host_replay` (float64 replayed
on the host CPU), `digest_programs`, `digest_stats`, `digest_results` and
`device_digests` (hashes and statistics computed on the values' device), `xla_stats`,
`optax_tags`, `nnx_paths` and
`internals` (every private JAX internal touched, checked at start).
"""
