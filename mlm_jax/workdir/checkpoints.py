"""Checkpoints: orbax CheckpointManager under WORKDIR/checkpoints.

A checkpoint holds the whole TrainState and the data iterator's position, saved asynchronously and
atomically; shapes are checked against the config before restoring, one line naming the parameter.
`restore_params` reads parameters alone; config.json and the tokenizer are files.py's.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from mlm_jax import paths
from mlm_jax.errors import CheckpointError
from mlm_jax.model.tree_paths import path_name
from mlm_jax.workdir import migrate, save_errors


def _handlers() -> dict:
  _whole_shards_in_one_process()
  return dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler())


@functools.cache   # once per process: the handler is orbax's global one
def _whole_shards_in_one_process() -> None:
  """In one process, one replica writes each array (orbax's replica-parallel saving off).

  orbax splits a replicated array among its replicas so that several hosts share the writing. In one
  process every replica is local, so the split buys nothing and costs an eagerly jitted slice per
  array, replica and shape at the first save of the process (docs/design_notes.md#checkpoints). The
  files are the same kind either way (the array metadata store is kept), and restoring does not
  depend on it. Multi-process runs keep orbax's default. The handler is orbax's global one for jax.Array: this is process-wide, as the
  condition is (the first Checkpointer comes after jax.distributed is initialized)."""
  if jax.process_count() != 1:
    return
  from orbax.checkpoint._src.metadata import array_metadata_store   # where orbax 0.12 keeps it
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False,
                                                array_metadata_store=array_metadata_store.Store()),
      override=True)


def check_shapes(meta: Any, abstract: Any, where: str, hint: str = "a checkpoint of another model shape?") -> None:
  """Raise CheckpointError naming the first array of `abstract` that the saved `meta` lacks or shapes differently."""
  saved = {path_name(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(meta) if hasattr(m, "shape")}
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
    name = path_name(path)
    if name not in saved:
      raise CheckpointError(f"checkpoint {where} has no array {name}: it was written by a different model or "
                            "optimizer config")
    if saved[name] != tuple(leaf.shape):
      raise CheckpointError(f"checkpoint {where}: {name} has shape {saved[name]}, but the config builds "
                            f"{tuple(leaf.shape)} ({hint})")


class Unreadable(CheckpointError):
  """A checkpoint whose files cannot be read (truncated, half-copied, corrupt): not a config mismatch."""


class Checkpointer:
  """Save / restore TrainState + data-iterator state; `keep` most recent checkpoints are kept."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True, read_only: bool = False):
    """`read_only`: another run's checkpoints (a branch's source), never written or pruned."""
    self.directory = os.path.join(paths.absolute(workdir), "checkpoints")
    options = (ocp.CheckpointManagerOptions(create=False, read_only=True) if read_only else
               ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_save))
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=_handlers())
    self._pending: tuple[int, int] | None = None   # (step, bytes) of the save being written
    self._failed = False                           # a failed save was reported: close() does not repeat it

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict | None, force: bool = True) -> bool:
    """Starts an async save (returns at once); `check` (every step), a later save or `wait` finishes it.
    A failed save raises SaveFailed, one line (save_errors.py)."""
    self.check(wait=True)
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {}))
    size = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(state))
    try:
      started = self.manager.save(step, args=args, force=force)
    except Exception as e:
      raise self._failure(step, size, e) from None
    self._pending = (step, size) if started else None
    return started

  def check(self, wait: bool = False) -> None:
    """Raise SaveFailed if the save being written has failed; cheap while it is still being written.
    `wait`: wait for it to end first."""
    if self._pending is None or (not wait and self.manager.is_saving_in_progress()):
      return
    (step, size), self._pending = self._pending, None
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise self._failure(step, size, e) from None

  def _failure(self, step: int, size: int, error: BaseException) -> CheckpointError:
    self._failed = True
    return save_errors.failed_save(self.directory, step, size, error, self.committed_steps())

  def committed_steps(self) -> list[int]:
    """The steps whose checkpoint folder is complete on disk (orbax renames a save's folder last)."""
    return sorted(s for s in self.all_steps() if paths.exists(os.path.join(self.directory, str(s))))

  def wait(self) -> None:
    self.check(wait=True)

  def check_compatible(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Raise CheckpointError naming the first parameter whose shape or presence differs; returns the tree
    to restore into and the function that makes `abstract_state`'s of it (workdir/migrate.py)."""
    try:
      meta = self.manager.item_metadata(step)["state"]
    except Exception as e:  # unreadable metadata: a corrupt or foreign checkpoint
      raise Unreadable(f"checkpoint {self.directory}/{step} cannot be read: {type(e).__name__}: {e}") from e
    item, upgrade = migrate.checkpoint_item(meta, abstract_state)
    check_shapes(meta, item, f"{self.directory}/{step}")
    return item, upgrade

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restore into the shardings of `abstract_state` (ShapeDtypeStructs with .sharding)."""
    item, upgrade = self.check_compatible(step, abstract_state)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(item), data=ocp.args.JsonRestore())
    try:
      restored = self.manager.restore(step, args=args)
    except Exception as e:
      raise Unreadable(f"checkpoint {self.directory}/{step} could not be restored: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    logging.info("restored checkpoint %s/%d", self.directory, step)
    return upgrade(restored.state), dict(restored.data or {})


  def restore_newest(self, abstract_state: Any, on_corrupt: str = "fallback") -> tuple[int, Any, dict]:
    """(step, state, data state) of the newest checkpoint that restores. With `on_corrupt`='fallback',
    unreadable newer ones are skipped with a warning and moved aside to `<step>.corrupt` once an older one
    has restored (never deleted: they can be inspected, or moved back); when none restores, nothing is
    moved and the newest's error stops the run. 'refuse': the newest's error stops it. A config mismatch
    (another model shape) always stops it."""
    skipped = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        state, data = self.restore(step, abstract_state)
      except Unreadable as e:
        if on_corrupt != "fallback":
          raise Unreadable(f"{e} (train.on_corrupt_checkpoint='refuse'; 'fallback' resumes from the newest "
                           "checkpoint that restores)") from None
        skipped.append((step, e))
        continue
      for bad, e in skipped:
        logging.warning("skipped checkpoint %d: %s; moved aside to %s", bad, " ".join(str(e).split()),
                        self.set_aside(bad))
      return step, state, data
    raise skipped[0][1]

  def set_aside(self, step: int) -> str:
    """Rename checkpoint `step` to `<step>.corrupt` (orbax lists numbered folders only), on process 0."""
    source = os.path.join(self.directory, str(step))
    target, n = f"{source}.corrupt", 1
    while paths.exists(target):
      n += 1
      target = f"{source}.corrupt-{n}"
    if jax.process_index() == 0:
      try:
        if paths.is_remote(source):
          import tensorflow as tf
          tf.io.gfile.rename(source, target)
        else:
          os.rename(source, target)
      except Exception as e:
        raise CheckpointError(f"checkpoint {source} cannot be restored and could not be moved aside to {target} "
                              f"({type(e).__name__}: {e}): move or remove it by hand") from None
    from mlm_jax import runtime
    runtime.sync_processes(f"set_aside_{step}")
    self.manager.reload()
    return target

  def close(self) -> None:
    """Finish the save being written (a failure raises SaveFailed, unless one was raised already)."""
    try:
      if not self._failed:
        self.check(wait=True)
    finally:
      with contextlib.suppress(Exception):   # after a failed save orbax raises its error again here
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


def single_device(tree: Any) -> Any:
  """ShapeDtypeStructs of `tree` on the first local device: restores whatever mesh wrote them."""
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), tree)


def restore_params(workdir: str, abstract_params: Any, step: int | None = None, subtree: str = "",
                   optional: tuple = (), item: str = "params") -> tuple[Any, int]:
  """(parameters, step) from WORKDIR/checkpoints: a training workdir or a `from_hf` output folder.

  Only the parameters are read (orbax's partial restore), placed as `abstract_params` says
  (ShapeDtypeStructs; with shardings for a mesh, or `single_device`); shapes are checked against it
  before anything is read. The optimizer's moments and counters stay on disk: restoring whole items
  put them, a few times the parameters, on one device of process 0. `subtree` names a part of
  `params` to restore as `abstract_params` (ELECTRA's `discriminator`), alone.
  `optional`: top-level parameters the checkpoint may lack; they are then absent from the result.
  `item`: "ema" reads the moving average of the parameters (train.ema_decay) instead.
  """
  directory = os.path.join(paths.absolute(workdir), "checkpoints")
  if paths.missing(directory):
    raise CheckpointError(f"{directory}: missing (no checkpoint was saved in {workdir})")
  options = ocp.CheckpointManagerOptions(create=False, read_only=True)
  manager = ocp.CheckpointManager(directory, options=options, item_handlers=dict(state=ocp.PyTreeCheckpointHandler()))
  try:
    steps = list(manager.all_steps())
    if not steps:
      raise CheckpointError(f"{directory}: no checkpoint")
    step = max(steps) if step is None else int(step)
    if step not in steps:
      raise CheckpointError(f"{directory}: no checkpoint for step {step} (have {', '.join(map(str, sorted(steps)))})")
    full = manager.item_metadata(step)["state"]
    if item not in full or full[item] is None:
      raise CheckpointError(f"{directory}/{step} has no {item} (train.ema_decay was 0 in that run)")
    meta = dict(full, params=full[item])   # the item, checked as the parameters are
    absent = [k for k in optional if k in abstract_params and k not in meta["params"]]
    if absent:
      abstract_params = without_keys(abstract_params, absent)
    placed = {subtree: abstract_params} if subtree else abstract_params
    check_shapes(meta, {"params": placed}, f"{directory}/{step}",
                 hint="does config.json describe the model that wrote it?")
    target = {item: placed}
    restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                     partial_restore=True)
    restored = manager.restore(step, args=ocp.args.Composite(state=restore))
  finally:
    manager.close()
  params = restored.state[item]
  return (params[subtree] if subtree else params), step


def steps_of(workdir: str) -> list[int]:
  """The steps of WORKDIR's checkpoints, ascending ([] when it has none); only read."""
  if paths.missing(os.path.join(paths.absolute(workdir), "checkpoints")):
    return []
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    return sorted(ckpt.all_steps())
  finally:
    ckpt.close()


def newest_step(workdir: str) -> int | None:
  steps = steps_of(workdir)
  return steps[-1] if steps else None


def without_keys(params: Any, names: list) -> Any:
  """The top level of `params` without `names` (the container types below may change: callers map
  the result back onto their own tree by path)."""
  return type(params)({k: v for k, v in params.items() if k not in names}) if names else params
