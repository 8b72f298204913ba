"""How a program's tensor becomes a stored value: exactly (bf16 as int16 bits, float8 as
uint8 bits, conj/neg views resolved, sparse densified), metadata only for uninitialised
memory and `meta` tensors, accelerator values read back in batches (`device.py`), a
tensor subclass through `subclass.py`. Also when values must be read without marking
their storage unresizable (`keep_resizable`: FSDP and DTensor free and re-allocate
storages with `resize_`)."""

import sys

import numpy as np

from ...trace import schema
from . import device, loaded


class _Values:
    """Writing a tensor as a value of an event (a mixin of `TorchCapture`)."""

    def _dtype_info(self, dtype):
        """(name, fast) for a torch dtype: fast if .numpy() holds it as is (cached)."""
        info = self._dtypes.get(dtype)
        if info is None:
            torch = loaded.torch
            fast = not (dtype.is_complex or dtype == torch.bfloat16
                        or (dtype.itemsize == 1 and dtype.is_floating_point))
            info = self._dtypes[dtype] = (str(dtype)[6:], fast)
        return info

    def _store(self, eid, slot, t, uninit=False, name=None, role=schema.ROLE_OUT):
        """Write tensor t as value `slot` of event eid (caller holds the lock)."""
        if type(t) is not self._Tensor and self.subclasses.special(t):
            # a DTensor's local shard and placement, or another subclass's metadata
            self.subclasses.store(eid, slot, t, uninit, name, role)
            return
        dname, fast = self._dtype_info(t.dtype)
        if fast and not uninit and t.is_cpu and t.layout is self._strided:
            try:
                arr = (t.detach() if t.requires_grad else t).numpy() if not \
                    self.keep_resizable else _host_keeping_storage(t)
            except RuntimeError:  # a negative-bit view
                arr = _host_keeping_storage(t.detach().resolve_neg())
            if not arr.flags.c_contiguous:
                arr = _c_order(t, arr)
            self.writer.add_value(eid, slot, arr, role=role, name=name)
            return
        self._store_slow(eid, slot, t, dname, uninit, name, role)

    def _store_slow(self, eid, slot, t, dname, uninit, name, role):
        torch = loaded.torch
        w = self.writer
        dtype = t.dtype
        if uninit:
            w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name,
                             flags=schema.VFLAG_UNINIT)
            return
        if t.is_meta:
            w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name)
            return
        t = t.detach()
        if t.layout != torch.strided:
            try:
                t = t.to_dense()
            except Exception:
                w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name)
                return
        if not t.is_cpu:
            names = device.storage_name(torch, dtype)
            if names is not None:   # read back in batches, never one op at a time
                if self._device_batch is None:
                    self._device_batch = device.DeviceBatch(w, torch)
                self._device_batch.add(eid, slot, t, names[0], names[1], role, name)
                return
            t = t.cpu()
        logical = None
        if dtype.is_complex:
            t = t.resolve_conj().resolve_neg()
            if dtype == torch.complex32:
                t = t.to(torch.complex64)
        elif dtype == torch.bfloat16:
            t, logical = t.view(torch.int16), "bfloat16"
        elif dtype.itemsize == 1 and dtype.is_floating_point:
            t, logical = t.view(torch.uint8), dname
        else:
            t = t.resolve_neg()
        w.add_value(eid, slot, t.numpy() if not self.keep_resizable else _host_keeping_storage(t),
                    role=role, name=name, logical_dtype=logical)


def _c_order(t, arr):
    """The C-order host copy of a non-contiguous CPU tensor (a transposed weight, a
    permuted view) that the hash and the stored bytes need: torch's blocked copy, ~4x
    faster than numpy's element-order `ascontiguousarray` on a transposed 4096x4096
    float32 matrix (72 vs 293 ms here; benchmarks/stats_floor.py's MLP has nine a step).
    Small values keep numpy's copy (no torch call)."""
    if arr.size < 65536:
        return np.ascontiguousarray(arr)
    with loaded.torch._C._DisableTorchDispatch(), loaded.torch.no_grad():
        return t.detach().contiguous().numpy()


def _host_keeping_storage(t):
    """A host array of CPU tensor t that leaves its storage resizable: `.numpy()` marks a
    storage not resizable for good, and FSDP frees and re-allocates its all-gather buffers
    with `storage.resize_` (`keep_resizable`). Through DLPack (no mark), else a copy."""
    if type(t).__torch_dispatch__ is not loaded.torch.Tensor.__torch_dispatch__:
        raise TypeError("a tensor subclass")   # DLPack would read a wrapper's empty storage
    t = t.detach()
    try:
        return np.from_dlpack(t)
    except (RuntimeError, TypeError, BufferError, ValueError):
        return t.clone().numpy()


def _own_dispatch(types):
    """Does one of these tensor subclasses dispatch ops itself (DTensor, another wrapper)?
    nn.Parameter and nn.Buffer are listed in `types` too (every op on a parameter), but
    their `__torch_dispatch__` is torch's disabled one: plain tensors underneath."""
    disabled = loaded.torch._C._disabled_torch_dispatch_impl
    return any(getattr(tp, "__torch_dispatch__", None) is not disabled for tp in types)


def _fsdp_possible():
    """Can FSDP1 be freeing storages (`keep_resizable`)? Only with FSDP imported and a
    process group up: FSDP needs one. Imported alone is no sign of use: torch._dynamo
    imports FSDP (an optimizer's first step does), so does HF transformers, and reading
    values through DLPack and checking each input's storage cost ~12 % of a tiny-op loop."""
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    dist = loaded.torch.distributed
    return dist.is_available() and dist.is_initialized()
