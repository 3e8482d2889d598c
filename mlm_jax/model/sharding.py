"""Device mesh and logical-axis sharding (MaxText style).

Parameters name their axes logically (`vocab`, `embed`, `heads`, `kv`, `mlp`, ...; see encoder.py);
`config.sharding.rules` maps each to a mesh axis, a tuple of axes, or None (replicated). The batch is
sharded over ("data", "fsdp"); the same code runs on one CPU, 8 fake CPU devices and multi-host slices.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import ml_collections

from mlm_jax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
  """Axis sizes from the config; one axis may be -1 and takes what is left."""
  unknown = set(mesh_cfg.keys()) - set(AXES)
  if unknown:
    raise ConfigError(f"config.mesh has unknown axes {sorted(unknown)}: expected {AXES}")
  sizes = [int(mesh_cfg.get(a, 1)) for a in AXES]
  fill = [i for i, s in enumerate(sizes) if s == -1]
  if len(fill) > 1:
    raise ConfigError(f"config.mesh={dict(zip(AXES, sizes))}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if fill:
    if known <= 0 or num_devices % known:
      raise ConfigError(f"config.mesh={dict(zip(AXES, sizes))}: {num_devices} devices are not divisible by {known}")
    sizes[fill[0]] = num_devices // known
  if math.prod(sizes) != num_devices or min(sizes) < 1:
    raise ConfigError(f"config.mesh={dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices, "
                      f"but {num_devices} are available")
  return tuple(sizes)


def make_mesh(mesh_cfg: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  try:
    from jax.experimental import mesh_utils
    arr = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # fake CPU devices or an unusual topology: plain order is fine
    arr = np.asarray(devices).reshape(shape)
  return Mesh(arr, AXES)


def _mesh_axes(name, rules: dict):
  if name is None:
    return None
  if name not in rules:
    raise ConfigError(f"logical axis {name!r} has no entry in config.sharding.rules")
  return rules[name]


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(mesh.shape[a] for a in axes)


def logical_to_spec(names, shape, mesh: Mesh, rules: dict, what: str = "") -> P:
  """PartitionSpec for one array; a dimension that the mesh axes do not divide is replicated."""
  spec, used = [], set()
  for dim, name in zip(shape, names):
    axes = _mesh_axes(name, rules)
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    if any(a in used for a in flat):   # a mesh axis may shard only one dimension
      axes, flat = None, ()
    if axes is not None and dim % _axis_size(mesh, axes):
      logging.warning("%s: dimension %d (%s) is not divisible by mesh axes %s; replicating it",
                      what, dim, name, axes)
      axes, flat = None, ()
    used.update(flat)
    spec.append(axes)
  return P(*spec)


def state_shardings(tree, mesh: Mesh, rules) -> object:
  """NamedShardings for a pytree whose nnx Variables carry `sharding_names`; other leaves are replicated."""
  rules = dict(rules)

  def one(path, x):
    if isinstance(x, nnx.Variable):
      names = x.get_metadata().get("out_sharding") or (None,) * len(x.shape)
      spec = logical_to_spec(names, x.shape, mesh, rules, jax.tree_util.keystr(path))
      return x.replace(NamedSharding(mesh, spec))
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over ("data", "fsdp"), the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def platform(mesh: Mesh) -> str:
  """The platform ("cpu", "tpu", "gpu") of the devices a mesh spans."""
  return mesh.devices.flat[0].platform


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local: dict, batch_sh: NamedSharding) -> dict:
  """This process's rows -> global jax.Arrays on the mesh (rows of all processes, in process order)."""
  return {k: jax.make_array_from_process_local_data(batch_sh, np.asarray(v)) for k, v in local.items()}

