"""Data parallel over 8 (simulated) devices: each device takes the log of its block of the
batch, pmean averages across devices. The rows of device 3's block are negative: its log
makes NaN, and the pmean hands it to every device."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
x = np.abs(np.random.default_rng(0).standard_normal((16, 4))).astype(np.float32) + 0.5
x[6:8] -= 3.0                               # device 3's block (rows 6 and 7)
np.save(os.environ.get("BATCH_OUT", os.devnull), x)
xs = jax.device_put(x, NamedSharding(mesh, P("data")))
w = jax.device_put(np.ones((4,), np.float32), NamedSharding(mesh, P()))


def local(w, x):
    return jax.lax.pmean(jnp.mean(jnp.log(x) @ w), "data")


f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(),
                          check_vma=False))
print(f(w, xs))
