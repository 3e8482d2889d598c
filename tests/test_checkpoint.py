"""Checkpoints of replicated arrays in one process: saved without compiling anything, restored exactly."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlm_jax.workdir import checkpoints


def test_replicated_arrays_save_without_compiling_and_restore(tmp_path):
  """orbax's replica-parallel saving would jit-compile a slice per array and shape at the first save
  when all 8 replicas are local; in one process mlm_jax turns it off (checkpoint._handlers)."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  replicated = NamedSharding(mesh, PartitionSpec())
  state = {f"w{i}": jax.device_put(jnp.arange(8 * (i + 1) * 16, dtype=jnp.float32).reshape(8 * (i + 1), 16),
                                   replicated) for i in range(4)}
  jax.block_until_ready(state)
  compiles = []
  listener = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(1, state, {"position": 3})
    ckpt.wait()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == [], f"{len(compiles)} compiles during the save"
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in state.items()}
  restored, data = ckpt.restore(1, abstract)
  ckpt.close()
  assert data == {"position": 3}
  for k, v in state.items():
    np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(v), err_msg=k)
