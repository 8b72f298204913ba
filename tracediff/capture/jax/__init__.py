"""The JAX capture: how tracediff observes a JAX/Flax/optax program (`recorder.JaxCapture`).

Importing this package imports nothing of JAX: `capture.start_captures` imports
`recorder` only once the script has imported `jax`. Every module here imports the real
JAX absolutely (`import jax`); this package's own name never stands for it.
"""
