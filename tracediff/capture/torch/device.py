"""Values of tensors on an accelerator: copied on the device, read back in batches.

Reading a CUDA tensor's bytes one op at a time (`t.cpu()`) stalls the GPU stream at
every op. Instead each value is cloned on its device (an async device-side copy: the
program may overwrite the original in place later) and its values row is reserved in the
writer; at the next flush (or past a byte budget) the batch is concatenated per device
and dtype, its statistics are computed there by torch ops (capture/torch/stats.py), and
the bytes come to the host in one transfer per group, into pinned memory with
`non_blocking=True` and one synchronisation. The host then hashes each value (xxh3_64 of
the exact bytes, as for CPU values) and stores its bytes (full level) or its statistics
(stats level). The code path is device-agnostic; on a CPU-only machine it is exercised
with CPU tensors (tests/test_fast_capture.py). docs/accelerators.md says what remains to measure.
"""

import numpy as np

from ...trace import values

BUDGET_BYTES = 256 << 20   # device bytes held before the batch is read back


class DeviceBatch:
    """Pending device values of one recording (the caller holds the writer's lock)."""

    def __init__(self, writer, torch):
        self.writer = writer
        self.torch = torch
        self.items = []          # (handle, device clone, storage, logical)
        self.bytes = 0
        writer.flush_hooks.append(self.drain)

    def add(self, eid, slot, t, storage, logical, role, name):
        """Reserve the row of value `slot` of event eid and keep a device copy of t
        (`storage`: the numpy dtype name of its bits; `logical`: the tensor's dtype)."""
        torch = self.torch
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            c = t.detach().clone(memory_format=torch.contiguous_format)
        handle = self.writer.reserve_value(eid, slot, logical, storage, tuple(t.shape),
                                           role=role, name=name)
        self.items.append((handle, c, storage, logical))
        self.bytes += c.numel() * c.element_size()
        if self.bytes >= BUDGET_BYTES:
            self.writer.flush()

    def drain(self):
        """Read the pending values back (one transfer per device and dtype) and fill
        their rows: hash, then bytes or statistics."""
        if not self.items:
            return
        items, self.items, self.bytes = self.items, [], 0
        torch = self.torch
        stats_level = self.writer.level != "full" or self.writer.max_bytes is not None
        groups = {}
        for it in items:
            groups.setdefault((it[1].device, it[1].dtype, it[2], it[3]), []).append(it)
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            for (device, dtype, storage, logical), group in groups.items():
                flats = [it[1].reshape(-1) for it in group]
                counts = [f.numel() for f in flats]
                flat = torch.cat(flats) if len(flats) > 1 else flats[0]
                stats = None
                if stats_level:   # statistics on the device, six numbers per value back
                    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
                    stats = torch_stats_batch(flat, starts, counts).cpu().numpy()
                bits = flat if storage == logical else flat.view(getattr(torch, storage))
                host = _to_host(torch, bits)
                arr = host.numpy() if host.numel() else np.zeros(0, np.dtype(storage))
                start = 0
                for k, (handle, _, _, _) in enumerate(group):
                    n = counts[k]
                    c = arr[start:start + n]
                    start += n
                    self.writer.fill_value(handle, c, storage, logical,
                                           stats=None if stats is None else tuple(stats[k]))


def torch_stats_batch(flat, starts, counts):
    from .stats import tensor_segment_stats

    return tensor_segment_stats(flat, starts, counts)


def _to_host(torch, flat):
    """One device-to-host copy of a batch: pinned memory, non_blocking, one sync."""
    if flat.device.type == "cpu":
        return flat
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    host.copy_(flat, non_blocking=True)
    torch.cuda.current_stream(flat.device).synchronize() if flat.device.type == "cuda" \
        else torch.accelerator.synchronize()
    return host


def storage_name(torch, dtype):
    """(storage numpy dtype name, logical name) of a torch dtype, or None when the fast
    batch cannot hold it (complex: read back one by one)."""
    if dtype.is_complex:
        return None
    logical = str(dtype)[6:]
    if dtype == torch.bfloat16:
        return "int16", "bfloat16"
    if dtype.itemsize == 1 and dtype.is_floating_point:
        return "uint8", logical
    name = values._dtype_name(np.dtype(logical)) if logical in values._NATIVE else None
    return (name, logical) if name else None
