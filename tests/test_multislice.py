"""Meshes over several TPU slices (ICI inside a slice, DCN between slices), on CPU devices.

CPU devices carry no `slice_index`, so each test device here is a real CPU device seen through a
proxy that adds one (8 devices, 2 slices: even ids in slice 0, odd ones in slice 1, so that no
plain reshape of the device list gives a mesh whose axes respect slices), which is all that
`mesh_utils.create_hybrid_device_mesh` reads. The AOT test of a real 2-slice TPU topology, whose
devices report their slices themselves, is in tests/test_aot.py.
"""
import jax
import ml_collections
import numpy as np
import pytest

from mlm_jax.config.defaults import default_config
from mlm_jax.errors import ConfigError
from mlm_jax.model import sharding


class SliceDevice:
  """A real device that also reports `slice_index`, as TPU devices of a multi-slice job do."""

  def __init__(self, device, slice_index: int):
    self.device, self.slice_index = device, slice_index

  def __getattr__(self, name):
    return getattr(self.device, name)


def _two_slices():
  return [SliceDevice(d, i % 2) for i, d in enumerate(jax.devices()[:8])]


def _mesh(**axes):
  cfg = default_config().mesh
  cfg.update(axes)
  return cfg


def _slices(grid):
  return np.vectorize(lambda d: d.slice_index)(grid)


def _spans(grid):
  """The mesh axes along which the slice index changes."""
  s = _slices(grid)
  return [a for i, a in enumerate(sharding.AXES) if (np.diff(s, axis=i) != 0).any()]


def test_default_puts_data_across_slices_and_keeps_fsdp_and_tensor_inside_one():
  grid = sharding.device_grid(_mesh(data=2, fsdp=2, tensor=2), _two_slices())
  assert grid.shape == (2, 2, 2)
  assert _spans(grid) == ["data"]
  assert (_slices(grid)[0] == 0).all() and (_slices(grid)[1] == 1).all()
  # Every device once; a real Mesh over the same devices (a train step runs on it in test_step's way).
  assert sorted(d.id for d in grid.flat) == list(range(8))
  mesh = jax.sharding.Mesh(np.vectorize(lambda d: d.device)(grid), sharding.AXES)
  x = jax.device_put(np.arange(16.0).reshape(8, 2), sharding.batch_sharding(mesh))
  assert float(jax.jit(lambda v: v.sum())(x)) == 120.0


def test_fsdp_across_slices_when_configured():
  grid = sharding.device_grid(_mesh(data=1, fsdp=-1, tensor=2, dcn_data=1, dcn_fsdp=2), _two_slices())
  assert grid.shape == (1, 4, 2)
  assert _spans(grid) == ["fsdp"]


def test_one_slice_is_the_flat_mesh():
  devices = [SliceDevice(d, 0) for d in jax.devices()[:8]]
  flat = sharding.device_grid(_mesh(data=2, fsdp=2, tensor=2), devices)
  assert [d.id for d in flat.flat] == list(range(8))
  assert sharding.num_slices(jax.devices()[:8]) == 1   # CPU devices: no slice_index, one slice


@pytest.mark.parametrize("axes, expected", [
    (dict(data=2, fsdp=2, tensor=2, dcn_data=1), "needs 1 slices, but 2 are available"),
    (dict(data=1, fsdp=-1, tensor=1), "data=1 over all devices cannot span dcn_data=2 of the 2 slices"),
    (dict(data=2, fsdp=2, tensor=2, dcn_data=-1, dcn_fsdp=-1), "at most one slices axis may be -1"),
])
def test_a_product_that_does_not_match_the_slices_is_one_line(axes, expected):
  with pytest.raises(ConfigError) as e:
    sharding.device_grid(_mesh(**axes), _two_slices())
  msg = str(e.value)
  assert expected in msg and "\n" not in msg, msg
  if "cannot span" in msg:   # says what would work
    assert "--config.mesh.dcn_fsdp=2 --config.mesh.dcn_data=1" in msg, msg


def test_older_mesh_configs_without_dcn_fields_still_build():
  cfg = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  assert sharding.make_mesh(cfg, jax.devices()[:8]).shape == {"data": 8, "fsdp": 1, "tensor": 1}


def test_tpu_vm_launch_of_two_slices_creates_a_queued_resource_and_runs_on_every_node():
  import subprocess
  from subproc import REPO
  out = subprocess.run(["bash", "launch/tpu_vm.sh", "--dry-run", "--name=t", "--zone=z", "--accelerator=v5p-64",
                        "--num_slices=2", "--", "--config=configs/xlmr_base.py", "--workdir=gs://b/r",
                        "--config.mesh.data=2", "--config.mesh.fsdp=-1"], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout.splitlines()
  assert any("queued-resources create t" in l and "--node-count=2" in l and "--node-prefix=t" in l for l in out), out
  runs = [l for l in out if "mlm_jax.train" in l]
  assert len(runs) == 2 and all("--worker=all" in l and "MLM_JAX_DISTRIBUTED=1" in l for l in runs), runs
  assert {l.split(" ssh ")[1].split()[0] for l in runs} == {"t-0", "t-1"}
  bad = subprocess.run(["bash", "launch/tpu_vm.sh", "--dry-run", "--name=t", "--zone=z", "--accelerator=v5p-8",
                        "--num_slices=0", "--", "--workdir=gs://b/r"], cwd=REPO, capture_output=True, text=True)
  assert bad.returncode == 2 and "--num_slices" in bad.stderr
