"""HDF5 schema of a tracediff trace (documented for humans in docs/format.md).

Everything variable-length (op names, module paths, source lines, shapes, dtypes) is
interned once in the `strings` dataset and referenced by index, so the three tables
stay fixed-width and can be appended to in chunks.
"""

import numpy as np

FORMAT_NAME = "tracediff.trace"
SCHEMA_VERSION = 1

# events.kind
KIND_CALL = 0      # a top-level compiled call (jax jit); its values are the real compiled outputs
KIND_EQN = 1       # a jaxpr equation replayed inside a call
KIND_EAGER = 2     # an eager JAX primitive (outside any jit)
KIND_OP = 3        # a torch aten op
KIND_OPTIM = 4     # an optimizer step snapshot: params, grads, state by name
KIND_INPUT = 5     # an external value first seen without a recorded producer
KIND_NAMES = {KIND_CALL: "call", KIND_EQN: "eqn", KIND_EAGER: "eager", KIND_OP: "op",
              KIND_OPTIM: "optim", KIND_INPUT: "input"}

# events.framework
FW_JAX = 1
FW_TORCH = 2
FW_NAMES = {0: "", FW_JAX: "jax", FW_TORCH: "torch"}

# events.phase
PHASE_FWD = 0
PHASE_BWD = 1
PHASE_OPTIM = 2
PHASE_NAMES = {PHASE_FWD: "forward", PHASE_BWD: "backward", PHASE_OPTIM: "optimizer"}

# events.origin: where the recorded values come from
ORIGIN_NONE = 0
ORIGIN_COMPILED = 1   # outputs of the real compiled program (what the script saw)
ORIGIN_REPLAY = 2     # equation-by-equation replay from the call's real inputs
ORIGIN_EAGER = 3      # the op as the script ran it, op by op
ORIGIN_SNAPSHOT = 4   # a copy of live state (optimizer step, external input)
ORIGIN_PROBE = 5      # `record --probe`: an intermediate of the call's jaxpr compiled again with
                      # every equation's outputs as program outputs (never seen by the script)
ORIGIN_NAMES = {ORIGIN_NONE: "", ORIGIN_COMPILED: "compiled", ORIGIN_REPLAY: "replay",
                ORIGIN_EAGER: "eager", ORIGIN_SNAPSHOT: "snapshot", ORIGIN_PROBE: "probe"}

# values.role
ROLE_OUT = 0
ROLE_IN = 1

# values.flags (bit set)
VFLAG_UNINIT = 1      # uninitialised memory (torch empty*): never compare
VFLAG_NOT_STORED = 2  # metadata only: bytes were not written (meta/sparse tensor, cap reached)
VFLAG_SCALAR = 4      # a Python scalar (torch .item())
VFLAG_STATS = 8       # bytes not stored, but `hash` and a `stats` row are (--level stats/calls,
                      # --max-bytes cap, stats outside an --ops/--modules window); set with
                      # VFLAG_NOT_STORED so that readers unaware of stats never read bytes

# inputs.producer special values
PRODUCER_UNKNOWN = -1   # produced outside what was recorded
PRODUCER_LITERAL = -2   # a literal constant in the program
PRODUCER_CONST = -3     # a constant closed over by the program

EVENT_DTYPE = np.dtype([
    ("framework", "u1"), ("kind", "u1"), ("phase", "u1"), ("origin", "u1"),
    ("op", "<i4"),          # strings index: primitive / aten op / call name
    ("params", "<i4"),      # strings index: short summary of parameters
    ("name_stack", "<i4"),  # strings index: Flax name stack / nn.Module path
    ("source", "<i4"),      # strings index: user file:line
    ("node", "<i4"),        # strings index: torch autograd node (DotBackward0), public API parent
    ("call", "<i8"),        # event id of the enclosing top-level call, -1 if none
    ("parent", "<i8"),      # enclosing event (nested jit eqn) or forward op of a backward op
    ("step", "<i8"),        # optimizer steps completed before this event
    ("iter", "<i8"),        # loop iteration when a while/scan body is stepped, else -1
])

VALUE_DTYPE = np.dtype([
    ("event", "<i8"), ("slot", "<i4"), ("role", "u1"), ("flags", "u1"),
    ("dtype", "<i4"),     # strings index: logical dtype name (float32, bfloat16, key<fry>)
    ("storage", "<i4"),   # strings index: numpy dtype the bytes are stored as
    ("shape", "<i4"),     # strings index: comma-separated dims, "" for a scalar
    ("name", "<i4"),      # strings index: pytree path / parameter name, or -1
    ("offset", "<i8"), ("nbytes", "<i8"),
    ("hash", "<u8"),      # xxh3-64 of the exact bytes: equal hash == bitwise equal
])

INPUT_DTYPE = np.dtype([
    ("event", "<i8"), ("slot", "<i4"), ("producer", "<i8"), ("producer_slot", "<i4"),
])

# Statistics of a value whose bytes were not stored (VFLAG_STATS), keyed by its row in
# `values`: 56 bytes, 64 with the value's hash.
STATS_DTYPE = np.dtype([
    ("value", "<i8"),     # row number in the values table
    ("min", "<f8"), ("max", "<f8"),    # over the non-NaN elements (inf included)
    ("mean", "<f8"), ("l2", "<f8"),    # over the finite elements
    ("nan", "<i8"), ("inf", "<i8"),    # counts (complex: real and imaginary parts counted)
])

# The user's source lines around each distinct events.source ("file.py:LINE"), recorded
# once per source string so that reports show code from the trace, never from the disk
# of whoever opens it (trace/sources.py writes them, Trace.source_lines reads them).
SOURCE_DTYPE = np.dtype([
    ("source", "<i4"),    # strings index: the events.source string these lines belong to
    ("first", "<i4"),     # line number of the first stored line
    ("lines", "<i4"),     # strings index: the stored lines joined with "\n"
    ("sha256", "<i4"),    # strings index: hex sha256 of the whole file as read, -1 if unknown
])

# The device an event ran on, for events tied to one device (a `shard_map`/`pmap` body
# replayed per device): one row per such event; events without a row ran on no one
# device (their `device` is "").
DEVICE_DTYPE = np.dtype([
    ("event", "<i8"),     # the event
    ("device", "<i4"),    # strings index: "platform:id" (cpu:3, cuda:1)
])

# Per-device copies of a global value (a sharded or replicated jax.Array): one row per
# addressable shard of a values row (same event, slot, role; dtype and storage are that
# row's). The global value stays in `values` exactly as without this table.
SHARD_DTYPE = np.dtype([
    ("event", "<i8"), ("slot", "<i4"), ("role", "u1"),
    ("flags", "u1"),      # SHARD_* bits below
    ("device", "<i4"),    # strings index: "platform:id"
    ("index", "<i4"),     # strings index: the shard's index in the global value ("0:4,:"), "" = whole
    ("replica", "<i4"),   # replica number of this shard (0 for the first copy of an index)
    ("shape", "<i4"),     # strings index: comma-separated dims of the shard
    ("offset", "<i8"), ("nbytes", "<i8"),   # own bytes in /blob, offset -1 when none
    ("hash", "<u8"),      # xxh3-64 of the shard's exact bytes (as values.hash)
])

# shards.flags
SHARD_SLICE = 1    # bytes equal the global value's slice at `index`: not stored again
SHARD_DIGEST = 2   # only the hash is stored (the bytes differ, or the global value has none)

# Where a value recorded as one rank's local shard of a torch DTensor (FSDP2's parameters,
# `distribute_tensor`) sits in the global tensor: one row per such values row (same event,
# slot, role). The values row holds the local shard's bytes and shape, as the rank had them.
PLACEMENT_DTYPE = np.dtype([
    ("event", "<i8"), ("slot", "<i4"), ("role", "u1"),
    ("placements", "<i4"),  # strings index: one per mesh dimension, ";"-joined: "Shard(dim=0)"
    ("mesh", "<i4"),        # strings index: the device mesh's shape, "2" / "2,4"
    ("coord", "<i4"),       # strings index: this rank's coordinate in the mesh, "1" / "0,3"
    ("global_shape", "<i4"),  # strings index: comma-separated dims of the global tensor
    ("offset", "<i4"),      # strings index: the shard's offset in the global tensor, "8,0"
    ("param", "<i4"),       # strings index: the parameter's qualified name, -1 if none
])

# An optimizer's settings at one of its steps, as the framework holds them: one row per
# scalar setting of an optimizer-step event (KIND_OPTIM): torch's `param_groups` (lr, betas,
# eps, weight_decay, amsgrad, maximize, foreach, ...), per group; optax's: the scalar values
# its transformations close over (`chain/0/scale_by_adam/b2`), group 0.
OPTIM_SETTING_DTYPE = np.dtype([
    ("event", "<i8"),     # the optimizer-step event
    ("group", "<i4"),     # torch: the index in `param_groups`; optax: 0
    ("key", "<i4"),       # strings index: the setting's name ("lr", "betas/1", ".../b2")
    ("value", "<f8"),     # the setting as a number (a bool as 0/1); NaN where it is none
    ("text", "<i4"),      # strings index: the setting as the framework prints it, -1 if none
])

TABLES = {"events": EVENT_DTYPE, "values": VALUE_DTYPE, "inputs": INPUT_DTYPE,
          "stats": STATS_DTYPE, "sources": SOURCE_DTYPE, "devices": DEVICE_DTYPE,
          "shards": SHARD_DTYPE, "placements": PLACEMENT_DTYPE,
          "optim_settings": OPTIM_SETTING_DTYPE}
# Tables a trace may lack (written by an older tracediff): read as empty.
OPTIONAL_TABLES = {"stats", "sources", "devices", "shards", "placements", "optim_settings"}
OPTIM_SETTING_STRINGS = ("key", "text")
PLACEMENT_STRINGS = ("placements", "mesh", "coord", "global_shape", "offset", "param")
