"""Device mesh and logical-axis sharding (MaxText style).

Parameters name their axes logically (`vocab`, `embed`, `heads`, `kv`, `mlp`, ...; see encoder.py);
`config.sharding.rules` maps each to a mesh axis, a tuple of axes, or None (replicated). The batch is
sharded over ("data", "fsdp"); the same code runs on one CPU, 8 fake CPU devices and multi-host slices.
Several TPU slices make a hybrid mesh: `mesh.data` etc. are each axis's size over all devices,
`mesh.dcn_data` etc. how many slices it spans (docs/multihost.md).
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


DCN_KEYS = tuple(f"dcn_{a}" for a in AXES)


def _fill(sizes: list, total: int, what: str, shown: dict) -> tuple[int, ...]:
  """`sizes` with its one -1 (if any) set to what `total` leaves; ConfigError unless the product is `total`."""
  fill = [i for i, s in enumerate(sizes) if s == -1]
  if len(fill) > 1:
    raise ConfigError(f"config.mesh={shown}: at most one {what} axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if fill:
    if known <= 0 or total % known:
      raise ConfigError(f"config.mesh={shown}: {total} {what} are not divisible by {known}")
    sizes[fill[0]] = total // known
  if math.prod(sizes) != total or min(sizes) < 1:
    raise ConfigError(f"config.mesh={shown} needs {math.prod(sizes)} {what}, but {total} are available")
  return tuple(sizes)


def mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
  """Axis sizes over all devices (ICI x DCN) from the config; one axis may be -1 and takes what is left."""
  unknown = set(mesh_cfg.keys()) - set(AXES) - set(DCN_KEYS)
  if unknown:
    raise ConfigError(f"config.mesh has unknown axes {sorted(unknown)}: expected {AXES} and {DCN_KEYS}")
  shown = {a: int(mesh_cfg.get(a, 1)) for a in AXES}
  return _fill(list(shown.values()), num_devices, "devices", shown)


def dcn_shape(mesh_cfg: ml_collections.ConfigDict, sizes: tuple[int, ...], slices: int) -> tuple[int, ...]:
  """How many slices each axis spans (`mesh.dcn_*`, one may be -1: the slices left); each axis size
  must be a multiple of it, the rest of the axis stays inside a slice (ICI)."""
  shown = {**dict(zip(AXES, sizes)), **{k: int(mesh_cfg.get(k, 1)) for k in DCN_KEYS}}
  dcn = _fill([shown[k] for k in DCN_KEYS], slices, "slices", shown)
  for axis, size, n in zip(AXES, sizes, dcn):
    if size % n:
      where = next((a for a, s in zip(AXES, sizes) if s % slices == 0 and s > 1), None)
      hint = f"; e.g. --config.mesh.{axis}={math.lcm(size, n)} (with another axis -1)"
      if where:
        hint += f", or --config.mesh.dcn_{where}={slices}" + "".join(f" --config.mesh.dcn_{a}=1" for a in AXES
                                                                    if a != where)
      raise ConfigError(f"config.mesh: {axis}={size} over all devices cannot span dcn_{axis}={n} of the "
                        f"{slices} slices (not a multiple){hint}")
  return dcn


def num_slices(devices: Sequence[jax.Device]) -> int:
  """Slices (ICI domains joined by the data-center network) among `devices`: TPU devices carry
  `slice_index`; devices without it (CPU, one slice, most GPUs) count as one slice."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def device_grid(mesh_cfg: ml_collections.ConfigDict, devices: Sequence) -> np.ndarray:
  """The devices laid out as the mesh (data, fsdp, tensor). On several slices the hybrid mesh of
  `mesh_utils.create_hybrid_device_mesh`: axis i spans `dcn_shape[i]` slices and within each slice
  an ICI block of `shape[i] / dcn_shape[i]` devices, so traffic on an axis with dcn 1 never leaves a slice."""
  devices = list(devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  slices = num_slices(devices)
  dcn = dcn_shape(mesh_cfg, shape, slices)
  from jax.experimental import mesh_utils
  if slices > 1:
    ici = tuple(s // d for s, d in zip(shape, dcn))
    try:
      return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    except ValueError as e:   # uneven slices, or an ICI block the slice's torus cannot hold
      raise ConfigError(f"config.mesh={dict(zip(AXES, shape))} with dcn {dict(zip(DCN_KEYS, dcn))} on "
                        f"{len(devices)} devices in {slices} slices: {' '.join(str(e).split())}") from None
  try:
    return mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # fake CPU devices or an unusual topology: plain order is fine
    return np.asarray(devices).reshape(shape)


def make_mesh(mesh_cfg: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  return Mesh(device_grid(mesh_cfg, devices), AXES)


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

