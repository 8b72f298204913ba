"""Tensor subclasses in a torch recording: DTensor (FSDP2's parameters, `distribute_tensor`)
as each rank's local shard and where it sits, any other wrapper subclass without its bytes.

A `TorchDispatchMode` sees an op on a DTensor once, with the DTensor arguments (`types`
non-empty); torch then runs DTensor's dispatch (a C++ fast path) with the mode popped, so
the local ops it runs on each rank's shard (and the functional collectives of a
redistribution) would go unseen. The recorder records the DTensor-level op as the user
wrote it (`on_sub_op`) and runs it with its mode pushed again: the mode is first handed
the same op, answers `NotImplemented` once (`redispatch`), and the dispatcher goes on to
DTensor's own dispatch, whose local ops the mode now records as the rank ran them. The
DTensor-level event is written after them (its outputs are their results), with the same
module path and source line.

A DTensor value is stored as its local shard (`_local_tensor`: the bytes and shape this
rank holds) plus a `placements` row (trace/schema.py): placements, mesh shape, this rank's
mesh coordinate, the global shape and the shard's offset in it, and the parameter's
qualified name for optimizer snapshots and for in-place writes to a parameter's local
shard (`to_local().add_()`, found by storage). Ops on FakeTensors that DTensor's sharding
propagation runs inside its dispatch are its internals: not recorded.

Any other subclass whose bytes `.numpy()` cannot read (a wrapper subclass with
`__torch_dispatch__`): its values are recorded as metadata only (shape, dtype), counted
by type in the manifest (`frameworks.torch.subclasses.unreadable_values`); `record`
warns and `info` says so. Capture goes on.
"""

from ...trace import schema

_MAX_TYPES = 20


class Subclasses:
    """The subclass handling of one `TorchCapture` (its emitter API)."""

    def __init__(self, cap, torch):
        self.cap = cap
        self.torch = torch
        self.redispatch = None     # the DTensor op handed back to DTensor's own dispatch once
        self.depth = 0             # >0 inside a DTensor op's dispatch
        self.dtensor_ops = 0
        self.dtensor_values = 0
        self.unreadable = 0
        self.unreadable_types = {}
        self.param_shards = {}     # storage data_ptr of a DTensor parameter's shard -> placement
        self._disabled = torch.Tensor.__torch_dispatch__
        self._specs = {}
        self._fake_key = None
        try:
            from torch.distributed.tensor import DTensor

            self.DTensor = DTensor
        except Exception:   # torch without distributed: no DTensor to meet
            self.DTensor = None

    # -- what a tensor is ------------------------------------------------------------------
    def special(self, t) -> bool:
        """A subclass with its own `__torch_dispatch__` (numpy() cannot read it)."""
        tp = type(t)
        return tp is not self.torch.Tensor and tp.__torch_dispatch__ is not self._disabled

    def is_dtensor(self, t) -> bool:
        return self.DTensor is not None and isinstance(t, self.DTensor)

    def dtensor_types(self, types) -> bool:
        D = self.DTensor
        return D is not None and any(issubclass(tp, D) for tp in types)

    def fake_active(self) -> bool:
        """Is FakeTensorMode on the stack (DTensor's sharding propagation)?"""
        torch = self.torch
        try:
            if self._fake_key is None:
                self._fake_key = torch._C._TorchDispatchModeKey.FAKE
            return torch._C._get_dispatch_mode(self._fake_key) is not None
        except Exception:
            return False

    # -- the DTensor-level op ----------------------------------------------------------------
    def run(self, func, args, kwargs):
        """Run a DTensor op with the recorder's mode pushed again, so that the local ops of
        DTensor's dispatch are recorded (the first call the mode gets back is this op
        itself: `redispatch` makes it answer NotImplemented)."""
        self.dtensor_ops += 1
        self.redispatch = func
        self.depth += 1
        try:
            with self.cap.mode:
                return func(*args, **kwargs)
        finally:
            self.depth -= 1
            self.redispatch = None

    # -- values ------------------------------------------------------------------------------
    def store(self, eid, slot, t, uninit, name, role):
        """Store a subclass value: a DTensor's local shard and its placement, or metadata."""
        cap = self.cap
        if self.is_dtensor(t):
            local = t._local_tensor
            if local is not None and not self.special(local):
                cap._store(eid, slot, local, uninit=uninit, name=name, role=role)
                self.dtensor_values += 1
                place = self.placement(t)
                if place is not None:
                    param = name.split("/", 1)[1] if name and "/" in name else None
                    cap.writer.add_placement(eid, slot, role, *place, param=param)
                return
        tn = type(t).__name__
        if tn == "AsyncCollectiveTensor":
            # a functional collective's result before `wait_tensor` (recorded with the
            # received value): not defined yet, so not a lost value
            cap.writer.add_meta_value(eid, slot, cap._dtype_info(t.dtype)[0], tuple(t.shape),
                                      role=role, name=name, flags=schema.VFLAG_UNINIT)
            return
        self.unreadable += 1
        if tn in self.unreadable_types or len(self.unreadable_types) < _MAX_TYPES:
            self.unreadable_types[tn] = self.unreadable_types.get(tn, 0) + 1
        try:
            dname = cap._dtype_info(t.dtype)[0]
            shape = tuple(t.shape)
        except Exception:
            dname, shape = "unknown", ()
        cap.writer.add_meta_value(eid, slot, dname, shape, role=role, name=name)

    def placement(self, t):
        """(placements, mesh, coord, global shape, offset) strings of a DTensor (cached per
        spec), or None when they cannot be read."""
        try:
            spec = t._spec
            hit = self._specs.get(spec)
        except Exception:
            spec, hit = None, None
        if hit is not None:
            return hit
        try:
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            mesh, placements = t.device_mesh, tuple(t.placements)
            coord = mesh.get_coordinate()
            _, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
            hit = (";".join(str(p) for p in placements), _dims(mesh.shape),
                   _dims(coord) if coord is not None else "", _dims(t.shape), _dims(offset))
        except Exception:
            return None
        if spec is not None and len(self._specs) < 10_000:
            try:
                self._specs[spec] = hit
            except TypeError:
                pass
        return hit

    def note_params(self, named):
        """Remember where each DTensor parameter's local shard lives (by storage), to name
        the parameter of an in-place write to it through a plain tensor."""
        shards = {}
        for n, p in named:
            if self.is_dtensor(p):
                try:
                    ptr = p._local_tensor.untyped_storage().data_ptr()
                except Exception:
                    continue
                place = self.placement(p)
                if ptr and place is not None:
                    shards[ptr] = place + (n, tuple(p._local_tensor.shape))
        if shards or self.param_shards:
            self.param_shards = shards

    def tag_write(self, eid, slot, ptr, out):
        """An op wrote, or viewed whole, a DTensor parameter's local shard (through a
        plain tensor: `p.to_local().add_()`): say which parameter and where."""
        hit = self.param_shards.get(ptr)
        if hit is not None and tuple(out.shape) == hit[6]:
            self.cap.writer.add_placement(eid, slot, schema.ROLE_OUT, *hit[:5], param=hit[5])

    def manifest(self):
        return {"dtensor_ops": self.dtensor_ops, "dtensor_values": self.dtensor_values,
                "unreadable_values": self.unreadable,
                "unreadable_types": dict(self.unreadable_types),
                "recorded_as": "a DTensor value is its rank's local shard, placed by the "
                               "`placements` table; other tensor subclasses' values are "
                               "metadata only (unreadable_values)"}


def _dims(xs):
    return ",".join(str(int(x)) for x in xs)
