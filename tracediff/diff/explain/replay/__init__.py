"""Re-execute one recorded op on this machine, from a trace's recorded inputs.

Three modules: `params.py` reads the recorded parameters back (and writes them as code for
the reproducer), `calls.py` rebuilds and runs the op within its output budget
(`build_call`), `oracle.py` is the long-double oracle of float64 ops.

Honest by construction:

* Only ops on an explicit allow-list are ever run (`TORCH_OPS`: aten operator names,
  looked up as `torch.ops.aten.<name>.<overload>`; `JAX_PRIMITIVES`: `jax.lax` primitive
  names, looked up as `jax.extend.core.primitives.<name>_p`). Nothing from a trace is
  evaluated, unpickled or imported by name.
* The op's non-array parameters come from the event's `params` summary, parsed with
  `ast.parse` (which never executes anything) and accepted only when every value is a
  literal (numbers, strings, None, booleans, tuples/lists of those) or one of a few
  named constants mapped here (`dtype('float32')`, `torch.float32`,
  `torch.contiguous_format`, `device(type='cpu')`, `Precision.HIGHEST`,
  `ConvDimensionNumbers(lhs_spec=(..), rhs_spec=(..), out_spec=(..))` of int tuples, built
  as `jax.lax.ConvDimensionNumbers`). A summary that was shortened at recording time
  ("..."; or, in a trace of an older tracediff that cut values in the middle, a summary
  of 240 characters or a value of 60 that does not parse) gives "parameters were
  shortened when recorded"; one that holds anything else gives "cannot replay: parameters not
  recorded in a form that can rebuild the call" (`CannotReplay`).
* Array inputs are the producer values of the event's rows in the `inputs` table. A
  literal constant of a jaxpr (producer -2) or a value that was not stored cannot be
  rebuilt: the op is then not replayed, and the reason says so.

`OpCall.run(inputs, upcast=False)` runs the op in its recorded dtypes; `upcast=True`
runs it with floating inputs (and dtype parameters) promoted to float64 / complex128:
the oracle for float16/bfloat16/float32 ops. For ops that are already float64 the
oracle is numpy in `np.longdouble` (x87 80-bit on x86-64) for the ops in
`_NUMPY_ORACLE` only; otherwise there is no oracle and the verdict says so.

Bounded by what the trace holds (its parameters are untrusted: `expand` with a recorded
`size=[250000000, 4]` asks for 4 GB from a scalar): before an op runs, `OpCall.run` (and
`check_size`, for the reproducer) computes the shapes and dtypes of its outputs without
running it (torch: the op on `meta` tensors; JAX: `jax.eval_shape`), and refuses
(`ReplayRefused`, a `CannotReplay` whose message starts with "replay refused: ") when they
would hold more elements than the op's recorded outputs (`OpCall.recorded`: the shapes of
its output rows in the values table, stored or not, `recorded_output_size`) or take more
than `MAX_OUTPUT_BYTES` (256 MiB). Elements, not bytes, are compared with the recording so
that a replay in a wider dtype than recorded is still run (and found not to reproduce);
the cap is in bytes and holds for the float64 oracle run (`upcast=True`) too. When the
sizes cannot be computed without running the op, it is not run either. (The long-double
numpy oracle of float64 ops produces the same shape as the checked op, at twice its
bytes; inputs are capped by the caller, 64 MB in `explain`.)
"""
