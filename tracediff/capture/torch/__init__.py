"""PyTorch capture: every aten op (forward, backward, optimizer), every optimizer step,
compiled graphs, collectives and DTensor shards, as trace events.

`recorder.TorchCapture` is what `capture.start_captures` installs once the script has
imported torch; it is put together from one mixin per concern:

- `dispatch`: the dispatch mode and the per-op hot path (`on_op`);
- `dataflow`: which event produced each input, `<input>` snapshots;
- `values`: a tensor written as a value (exact bytes, metadata for uninitialised memory);
- `opinfo`: facts about an aten overload and the `params` summary of its arguments;
- `modules`, `sources`: an op's module path and the user's source line;
- `optimizer`: optimizer step hooks and snapshots;
- `emitter`: the API its helpers record through.

Helpers recording on its behalf: `compiled` (torch.compile, with `compiled_graphs`,
`compiled_calls`, `compiled_probe`), `collectives` (c10d), `subclass` (DTensor and other
tensor subclasses), `autocast` (autocast regions); `stats` and `device` compute
statistics and read values back on the values' device. `loaded` holds the torch module.

Nothing here imports torch at import time, nor anything of the JAX capture.
"""
