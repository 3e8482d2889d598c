"""Checkpoints: orbax CheckpointManager under WORKDIR/checkpoints.

Each checkpoint holds the whole TrainState (params, AdamW moments, step, skipped-update count) and
the data iterator's position, so a restored run continues the same data stream with the same
masks. Saves are asynchronous and atomic (orbax writes to a temporary directory and renames it
when complete), so a process killed mid-save leaves the previous checkpoint restorable.

Before restoring, every array's shape in the checkpoint is compared with what the config builds,
so a checkpoint of another model fails with one line naming the parameter, not an orbax traceback,
and nothing on disk is touched.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging


class CheckpointError(ValueError):
  pass


def _key(path) -> str:
  parts = []
  for k in path:
    k = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
    parts.append(str(k))
  return ".".join(parts)


class Checkpointer:
  """Save / restore TrainState + data-iterator state; `keep` most recent checkpoints are kept."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    handlers = dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler())
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict | None, force: bool = True) -> bool:
    """Starts an async save (returns at once); a later save or `wait` finishes it."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {}))
    return self.manager.save(step, args=args, force=force)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def check_compatible(self, step: int, abstract_state: Any) -> None:
    """Raise CheckpointError naming the first parameter whose shape or presence differs."""
    try:
      meta = self.manager.item_metadata(step)["state"]
    except Exception as e:  # unreadable metadata: a corrupt or foreign checkpoint
      raise CheckpointError(f"checkpoint {self.directory}/{step} cannot be read: {type(e).__name__}: {e}") from e
    saved = {_key(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(meta)
             if hasattr(m, "shape")}
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
      name = _key(path)
      if name not in saved:
        raise CheckpointError(f"checkpoint {self.directory}/{step} has no array {name}: it was written by "
                              "a different model or optimizer config")
      if saved[name] != tuple(leaf.shape):
        raise CheckpointError(f"checkpoint {self.directory}/{step}: {name} has shape {saved[name]}, but "
                              f"the config builds {tuple(leaf.shape)} (a checkpoint of another model shape?)")

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restore into the shardings of `abstract_state` (ShapeDtypeStructs with .sharding)."""
    self.check_compatible(step, abstract_state)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    try:
      restored = self.manager.restore(step, args=args)
    except Exception as e:
      raise CheckpointError(f"checkpoint {self.directory}/{step} could not be restored: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    logging.info("restored checkpoint %s/%d", self.directory, step)
    return restored.state, dict(restored.data or {})

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)


@jax.jit
def _all_finite(tree):
  leaves = [jax.numpy.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  return jax.numpy.stack(leaves).all() if leaves else jax.numpy.bool_(True)


def all_finite(tree: Any) -> bool:
  """True when every floating-point array is finite (one compiled reduction, one host sync)."""
  return bool(jax.device_get(_all_finite(tree)))


def load_params(path: str, abstract_params: Any) -> Any:
  """Parameters only, from a workdir's latest checkpoint or a `from_hf` output folder.

  Both hold an orbax checkpoint manager directory at PATH/checkpoints whose 'state' item has a
  `params` subtree; shapes are checked against the config before anything is read.
  """
  ckpt = Checkpointer(path, async_save=False)
  step = ckpt.latest_step()
  if step is None:
    raise CheckpointError(f"init_from={path!r}: no checkpoint under {ckpt.directory}")
  ckpt.check_compatible(step, {"params": abstract_params})
  # Restore only the params subtree (the optimizer state of the source run is not needed).
  meta = ckpt.manager.item_metadata(step)["state"]
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = {k: (abstract_params if k == "params" else
                jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), v))
            for k, v in dict(meta).items()}
  restored = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
  ckpt.close()
  return restored.state["params"]
