"""Checkpoints of replicated arrays in one process: saved without compiling anything, restored exactly."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlm_jax.workdir import checkpoints, restore


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
  restored, data = restore.restore_state(ckpt, 1, abstract)
  ckpt.close()
  assert data == {"position": 3}
  for k, v in state.items():
    np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(v), err_msg=k)


def _truncate_largest_file(folder):
  files = [p for p in folder.rglob("*") if p.is_file()]
  biggest = max(files, key=lambda p: p.stat().st_size)
  with open(biggest, "r+b") as f:
    f.truncate(biggest.stat().st_size // 2)


def test_an_unreadable_newest_checkpoint_is_set_aside_for_the_previous_one(tmp_path):
  """'fallback' (the default) restores the newest checkpoint that restores and moves the unreadable
  newer one to <step>.corrupt, kept; 'refuse' stops with its one-line error; a config mismatch is never
  taken for corruption."""
  import pytest
  from mlm_jax.errors import CheckpointError
  state = lambda v: {"w": jnp.full((64, 64), v, jnp.float32), "step": jnp.asarray(v, jnp.int32)}
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  for step in (1, 2):
    ckpt.save(step, state(step), {"rows": step})
  ckpt.close()
  _truncate_largest_file(tmp_path / "checkpoints" / "2")
  abstract = restore.single_device(jax.eval_shape(lambda: state(0)))

  refusing = checkpoints.Checkpointer(str(tmp_path))
  with pytest.raises(restore.Unreadable, match=r"checkpoints/2 .*on_corrupt_checkpoint='refuse'") as e:
    restore.restore_newest(refusing, abstract, "refuse")
  assert "\n" not in str(e.value)
  refusing.close()
  wrong = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
  mismatch = checkpoints.Checkpointer(str(tmp_path))
  with pytest.raises(CheckpointError, match="has shape") as e:
    restore.restore_newest(mismatch, restore.single_device(wrong))
  assert not isinstance(e.value, restore.Unreadable)
  mismatch.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2"]

  ckpt = checkpoints.Checkpointer(str(tmp_path))
  step, restored, data = restore.restore_newest(ckpt, abstract)
  assert step == 1 and data == {"rows": 1} and float(restored["w"][0, 0]) == 1.0
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2.corrupt"]
  assert ckpt.all_steps() == [1]
  ckpt.save(2, state(2), {"rows": 2})   # step 2 is written again beside the one set aside
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2", "2.corrupt"]


_RESTORE_PEAK = """
import json, sys, threading
import jax, numpy as np, psutil
from mlm_jax.workdir import restore
dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
abstract = {"w": jax.ShapeDtypeStruct((1024, 256), np.float32, sharding=dev)}
me, done, peak = psutil.Process(), threading.Event(), [0]
def sample():   # the resident set every millisecond while the restore runs
  while not done.is_set():
    peak[0] = max(peak[0], me.memory_info().rss)
    done.wait(0.001)
before = me.memory_info().rss
watcher = threading.Thread(target=sample)
watcher.start()
params, step = restore.restore_params(sys.argv[1], abstract)
done.set()
watcher.join()
assert step == 1 and float(params["w"][3, 5]) == 3 * 256 + 5
print(json.dumps(dict(peak_mb=(peak[0] - before) / 2**20)))
"""


def test_restoring_parameters_leaves_the_optimizer_state_on_disk(tmp_path):
  """`init_from`, merges and exports read a checkpoint's parameters only: the Adam moments beside them
  (here 2 x 64 MB against 1 MB of parameters; ~6.7 GB for XLM-R large) stay on disk instead of landing
  on one device of process 0. Measured as the peak RSS the restore adds, in a process of its own."""
  import subprocess
  import sys
  from subproc import REPO, cpu_env
  w = np.arange(1024 * 256, dtype=np.float32).reshape(1024, 256)
  moment = np.ones((16 * 1024, 1024), np.float32)   # 64 MB
  state = {"step": np.int32(1), "params": {"w": w}, "opt_state": {"mu": moment, "nu": moment + 1}}
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(1, state, {})
  ckpt.close()
  del moment, state
  p = subprocess.run([sys.executable, "-c", _RESTORE_PEAK, str(tmp_path)], cwd=REPO, env=cpu_env(),
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  import json
  peak = json.loads(p.stdout.strip().splitlines()[-1])["peak_mb"]
  assert peak < 50, f"restoring 1 MB of parameters added {peak:.0f} MB at its peak"
