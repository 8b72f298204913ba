"""JAX, per device: the shards and replicas of global arrays, and `shard_map`/`pmap`
bodies replayed device by device.

A sharded or replicated `jax.Array` is still recorded as one global value (what
alignment and `locate` compare), and, beside it, one `shards` row per addressable shard:
the device, the shard's index in the global value, its replica number and the digest of
its bytes (the bytes too when they differ from the global value's slice, e.g. a replica
that departed from replica 0). A value on one device of a process that has several
gives its event that device.

`shard_map` (and `pmap`, which JAX runs as a jit of a `shard_map`) is replayed from each
device's real input block, in lockstep: every equation of the body becomes one event per
device (`device` set, parent the `shard_map` equation), run on that device; an equation
that names the mesh's axes (`psum`, `pmean`, `all_gather`, `ppermute`, `axis_index`,
...) is evaluated for all devices at once by `jax.vmap` over the stacked per-device
inputs with the mesh's axis names, which gives each device the collective's result, and
is recorded per device with its per-device inputs and outputs. The equation's global
outputs come from running the `shard_map` itself on the global inputs, as without
per-device capture.

Several processes (`jax.distributed`): a process sees only its own devices' shards (a
global array is recorded as its shards; its global value has no bytes here). The body is
replayed on this process's devices; a collective first gathers every process's
per-device inputs (`process_allgather`, a copy: no arithmetic) and then computes every
device's result as above. Every process replays the same body, so all gather the same
collectives in the same order.
"""

import numpy as np

from ...trace import schema
from . import internals
from .optax_tags import OPTAX_TAG

_AXIS_KEYS = ("axes", "axis_name")
_IDENTITY = {"pvary"}   # per device the value itself (a type-level marker of varying values)


def device_name(d):
    """'cpu:3', 'cuda:1': the platform and the device id."""
    return f"{d.platform}:{d.id}"


def single_device(x):
    """'cpu:3' when `x` is an array committed to exactly one device in a process with
    several devices (so that which one matters), else None."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return None
    try:
        devs = sharding.device_set
        if len(devs) != 1:
            return None
        import jax

        if jax.device_count() < 2:
            return None
        return device_name(next(iter(devs)))
    except Exception:   # a tracer or a deleted array: no device to name
        return None


def store_shards(writer, eid, slot, x, whole, role, logical):
    """One `shards` row per addressable shard of a global array over several devices."""
    sharding = getattr(x, "sharding", None)
    if sharding is None or logical is not None:
        return 0
    try:
        if len(sharding.device_set) < 2:
            return 0
        shards = sorted(x.addressable_shards, key=lambda s: (s.device.id, s.replica_id))
    except Exception:   # deleted (donated) or not an array: nothing per device
        return 0
    try:
        for s in shards:
            writer.add_shard(eid, slot, np.asarray(s.data), device=device_name(s.device),
                             index=s.index, replica=s.replica_id, whole=whole, role=role)
    finally:
        writer.forget_slices()
    return len(shards)


def _names_in(val):
    vals = val if isinstance(val, (tuple, list, frozenset, set)) else (val,)
    return {a for a in vals if isinstance(a, str)}


def uses_axes(eqn, names, depth=0):
    """Does this equation (or a jaxpr nested in it) name one of the mesh axes `names`?"""
    if depth > 32:
        return True

    def names_axis(e):
        return any(key in e.params and _names_in(e.params[key]) & names for key in _AXIS_KEYS)

    return names_axis(eqn) or any(internals.any_equation(sub, names_axis, True, depth + 1)
                                  for sub in internals.sub_jaxprs(eqn))


def has_mesh(jaxpr, depth=0):
    """Does a jaxpr (or one nested in it) run over a device mesh (shard_map)?"""
    return internals.any_equation(jaxpr, lambda e: "mesh" in e.params, True, depth)


def _spec_index(spec, shape, mesh, pos):
    """The block of a global value of `shape` that the device at mesh position `pos` gets
    under PartitionSpec `spec`, as a tuple of slices."""
    names = list(mesh.axis_names)
    sizes = dict(zip(names, mesh.devices.shape))
    entries = list(spec) + [None] * (len(shape) - len(tuple(spec)))
    idx = []
    for dim, entry in zip(shape, entries):
        if entry is None:
            idx.append(slice(None))
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        n, b = 1, 0
        for a in axes:
            b = b * sizes[a] + pos[names.index(a)]
            n *= sizes[a]
        size = dim // n
        idx.append(slice(b * size, (b + 1) * size))
    return tuple(idx)


class BodyReplay:
    """Replays one `shard_map` equation's body per device (see the module docstring)."""

    def __init__(self, cap):
        self.cap = cap
        self.bodies = 0
        self.device_events = 0

    def replay(self, eqn, ivals, irefs, call_id, parent, ns, it, src):
        p = eqn.params
        mesh = p["mesh"]
        body = p["jaxpr"]
        consts = list(getattr(body, "consts", ()))
        body = getattr(body, "jaxpr", body)
        grid = np.asarray(mesh.devices)
        positions = list(np.ndindex(grid.shape))
        here = _process_index()
        # several processes (jax.distributed): this process replays its own devices only
        remote = any(getattr(grid[pos], "process_index", here) != here for pos in positions)
        if remote:
            positions = [pos for pos in positions if grid[pos].process_index == here]
        devices = [grid[pos] for pos in positions]
        names = [device_name(d) for d in devices]
        blocks, brefs = [], []
        for x, ref, spec in zip(ivals, irefs, p["in_specs"]):
            blocks.append([self._block(x, spec, mesh, pos, d) for pos, d in zip(positions, devices)])
            brefs.append([ref] * len(devices))
        self.bodies += 1
        ctx = _Lockstep(self, mesh, devices, names, call_id, it, remote)
        outs, _ = ctx.run(body, consts, blocks, brefs, [parent] * len(devices), ns, src)
        try:   # the global outputs, assembled from the devices' outputs as shard_map does
            return [_assemble(o, spec, mesh, devices) for o, spec in zip(outs, p["out_specs"])]
        except Exception:   # a layout not rebuilt here: run the equation on the globals
            return self.cap.bind(eqn, ivals)

    @staticmethod
    def _block(x, spec, mesh, pos, d):
        """Device `d`'s real input: its own shard of `x` when it holds that block, else
        the block cut from the global value and placed on `d`."""
        import jax

        shape = tuple(getattr(x, "shape", ()))
        idx = _spec_index(spec, shape, mesh, pos)
        for s in _local_shards(x):
            if s.device == d and tuple(s.data.shape) == tuple(
                    len(range(*sl.indices(n))) for sl, n in zip(idx, shape)) and \
                    all(sl.indices(n) == si.indices(n) for sl, si, n in zip(idx, s.index, shape)):
                return s.data
        return jax.device_put(np.asarray(x)[idx], d)


class _Lockstep:
    """Runs a body jaxpr on every device at once, equation by equation."""

    def __init__(self, owner, mesh, devices, names, call_id, it, remote=False):
        self.owner, self.cap = owner, owner.cap
        self.mesh, self.devices, self.names = mesh, devices, names
        self.remote = remote   # the mesh spans other processes: collectives gather from them
        self.axis_names = set(mesh.axis_names)
        self.call_id, self.it = call_id, it
        # Where each device's equations run. Accelerators: on that device (a chip that
        # computes differently shows it in the replay). Host CPU "devices" (e.g.
        # --xla_force_host_platform_device_count) are one CPU: all run on the first,
        # so each equation compiles once instead of once per device (measured: 246
        # compilations, most of the recording time, for an 8-device body of 2 steps).
        self.run_on = devices[0] if all(d.platform == "cpu" for d in devices) else None

    def _place(self, x, k):
        import jax

        target = self.run_on if self.run_on is not None else self.devices[k]
        if isinstance(x, jax.Array):
            try:
                if x.sharding.device_set == {target}:
                    return x
            except Exception:
                return x
            return jax.device_put(x, target)
        return x

    def run(self, jaxpr, consts, vals, refs, parents, prefix, source):
        from jax.extend.core import Literal

        cap, n = self.cap, len(self.devices)
        env = {}
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = ([c] * n, [cap.producer(c, "constant")] * n)
        for v, x, r in zip(jaxpr.invars, vals, refs):
            env[v] = (x, r)

        def read(v):
            if isinstance(v, Literal):
                return [v.val] * n, [(schema.PRODUCER_LITERAL, 0)] * n
            return env[v]

        for eqn in jaxpr.eqns:
            site = cap.site(eqn)
            if site.mode == "skip":
                continue
            ins = [read(v) for v in eqn.invars]
            eids, nss, srcs = [], [], []
            collective = uses_axes(eqn, self.axis_names)
            for k in range(n):
                # a collective reads every device's input: one input row per device and slot
                irefs = [r[k] for _, r in ins] if not collective else None
                eid, ns, src = cap.eqn_event(site, irefs, prefix, source,
                                             self.call_id, parents[k], self.it,
                                             schema.ORIGIN_REPLAY, device=self.names[k])
                if collective:
                    w = cap.session.writer
                    for slot, (_, r) in enumerate(ins):
                        for ref in (r if r[0][0] != schema.PRODUCER_LITERAL else r[:1]):
                            w.add_input(eid, slot, *ref)
                eids.append(eid)
                nss.append(ns)
                srcs.append(src)
            cap.eqns += 1
            self.owner.device_events += n
            if site.mode == "call" and collective:
                outs_k = self.run(site.sub.jaxpr, list(site.sub.consts), [x for x, _ in ins],
                                  [r for _, r in ins], eids, nss[0], srcs[0])
                outs = [[o[k] for o in outs_k[0]] for k in range(n)]
            elif eqn.primitive.name in _IDENTITY:
                outs = [[x[k] for x, _ in ins] for k in range(n)]
            elif collective:
                outs = self._vmapped(eqn, [x for x, _ in ins])
            else:
                outs = [cap.bind(eqn, [self._place(x[k], k) for x, _ in ins]) for k in range(n)]
            keep = not cap.filtered or cap.opts.selected(site.op, nss[0])
            for k in range(n):
                for slot, x in enumerate(outs[k]):
                    cap.store(eids[k], slot, x, store=keep)
            tag = str(eqn.params.get("name", "")) if site.op == "name" else ""
            if tag.startswith(OPTAX_TAG):   # an optax step inside the body (pmap): the first
                for slot in range(len(outs[0])):   # device's values name the step
                    cap._pending_optim[tag[len(OPTAX_TAG):]] = cap._host(outs[0][slot])
            for slot, v in enumerate(eqn.outvars):
                if type(v).__name__ != "DropVar":
                    env[v] = ([outs[k][slot] for k in range(n)], [(eids[k], slot) for k in range(n)])
        res = [read(v) for v in jaxpr.outvars]
        return [x for x, _ in res], [r for _, r in res]

    def _vmapped(self, eqn, per_input):
        """A collective (or anything naming the mesh axes) for all devices at once:
        `jax.vmap` over the stacked per-device inputs, one vmap per mesh axis named like
        it, so `psum`/`all_gather`/`ppermute`/`axis_index` see every device's value.
        Returns [[outputs] per device], each output placed on its device."""
        import jax

        grid = np.asarray(self.mesh.devices).shape
        axis_names = list(self.mesh.axis_names)
        if self.remote:   # every device's input, this process's and the others'
            stacked, mine = self._gather(per_input)
            mapped = [True] * len(per_input)
            args = [h.reshape(grid + h.shape[1:]) for h in stacked]
        else:
            mine = None
            mapped = [not _same_for_all(xs) for xs in per_input]
            args = []
            for xs, m in zip(per_input, mapped):
                if m:
                    host = np.stack([np.asarray(x) for x in xs])
                    args.append(host.reshape(grid + host.shape[1:]))
                else:
                    args.append(xs[0])
        cap = self.cap

        def f(*xs):
            return cap.bind(eqn, list(xs))

        for name, size in reversed(list(zip(axis_names, grid))):
            f = jax.vmap(f, in_axes=tuple(0 if m else None for m in mapped), axis_name=name,
                         axis_size=size)
        outs = f(*args)
        total = int(np.prod(grid, dtype=np.int64))
        flat = [np.asarray(o).reshape((total,) + np.asarray(o).shape[len(grid):]) for o in outs]
        rows = mine if mine is not None else range(len(self.devices))
        return [[jax.device_put(o[g], self.run_on or self.devices[k]) for o in flat]
                for k, g in enumerate(rows)]

    def _gather(self, per_input):
        """Several processes: every device's value of each input, stacked in mesh order
        (row-major over the mesh), gathered from all processes (`process_allgather`, a
        copy: no arithmetic), and the mesh-order rows of this process's devices. Every
        process replays the same body, so all gather the same collectives in order."""
        from jax.experimental import multihost_utils

        grid = np.asarray(self.mesh.devices)
        order = [grid[pos] for pos in np.ndindex(grid.shape)]
        here = _process_index()
        local = [np.stack([np.asarray(x) for x in xs]) for xs in per_input]
        procs, got = multihost_utils.process_allgather((np.int32(here), local))
        row_of = {int(p): i for i, p in enumerate(np.asarray(procs).reshape(-1))}
        seen, where = {}, []
        for d in order:   # the j-th device of process p sits at got[row_of[p]][j]
            p = int(d.process_index)
            j = seen[p] = seen.get(p, -1) + 1
            where.append((row_of[p], j))
        stacked = [np.stack([np.asarray(g)[r][j] for r, j in where]) for g in got]
        mine = [i for i, d in enumerate(order) if int(d.process_index) == here]
        return stacked, mine


def _assemble(per_device, spec, mesh, devices):
    """A global array from each device's block under PartitionSpec `spec` (what shard_map
    returns): each block stays on its device; a dimension split over mesh axes is that
    many blocks long. Replicated dimensions keep what each device holds."""
    import jax
    from jax.sharding import NamedSharding

    block = tuple(np.shape(per_device[0]))
    sizes = dict(zip(mesh.axis_names, np.asarray(mesh.devices).shape))
    entries = list(spec) + [None] * (len(block) - len(tuple(spec)))
    shape = []
    for dim, entry in zip(block, entries):
        axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        shape.append(dim * int(np.prod([sizes[a] for a in axes], dtype=np.int64)))
    arrays = [jax.device_put(x, d) for x, d in zip(per_device, devices)]
    return jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(mesh, spec),
                                                    arrays)


def _local_shards(x):
    """x.addressable_shards, [] when it has none or cannot list them (jax 0.10.2: a
    `device_put` onto a replicated sharding across processes raises there)."""
    try:
        return list(getattr(x, "addressable_shards", ()))
    except Exception:
        return []


def _process_index():
    import jax

    try:
        return int(jax.process_index())
    except Exception:   # no backend: one process
        return 0


def _same_for_all(xs):
    first = xs[0]
    return all(x is first for x in xs)


def distributed_section(existing):
    """The manifest's `distributed` section for a multi-process JAX run (jax.distributed),
    None for a single process (see `merge_distributed`)."""
    try:
        import jax

        count, index = int(jax.process_count()), int(jax.process_index())
        local = [device_name(x) for x in jax.local_devices()] if count > 1 else []
    except Exception:
        return None
    return merge_distributed(existing, index, count, local)


def merge_distributed(existing, index, count, local_devices):
    """`existing` (what the launcher variables gave, runner.distributed_rank) completed
    with `process_index`, `process_count`, `local_devices`, and `rank`/`world_size`/
    `backend` where no launcher set them; None when there is one process."""
    if count < 2:
        return None
    d = dict(existing or {})
    d.setdefault("rank", index)
    d.setdefault("world_size", count)
    d.setdefault("backend", "jax.distributed")
    d["process_index"], d["process_count"] = index, count
    d["local_devices"] = list(local_devices)
    return d


class _Devices:
    """JaxCapture's devices and processes: the one device a call runs on, and this
    process's place among several (`jax.distributed`) in the manifest."""

    def _args_device(self, args, closed):
        """The one device a call runs on: all its array arguments on that device and no
        mesh in its program (a shard_map spans the mesh's devices); else None."""
        if not self.per_device:
            return None
        devs = {single_device(x) for x in args if hasattr(x, "sharding")}
        if len(devs) != 1 or None in devs:
            return None
        hit = self._mesh_calls.get(id(closed))
        if hit is None or hit[0] is not closed:
            hit = self._mesh_calls[id(closed)] = (closed, has_mesh(closed.jaxpr))
        return None if hit[1] else devs.pop()

    def _record_distributed(self):
        """The manifest's `distributed` section, where several processes ran the script."""
        w = self.session.writer
        try:
            dist = distributed_section(w._manifest.get("distributed"))
        except Exception:  # informative only
            dist = None
        if dist is not None:
            w.update_manifest(distributed=dist)
