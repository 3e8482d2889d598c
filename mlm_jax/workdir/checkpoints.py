"""Checkpoints: orbax CheckpointManager under WORKDIR/checkpoints.

A checkpoint holds the whole TrainState and the data iterator's position, saved asynchronously and
atomically. Restoring (the whole state, or parameters alone) is restore.py's; config.json and the
tokenizer are files.py's.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from mlm_jax import paths
from mlm_jax.errors import CheckpointError
from mlm_jax.workdir import save_errors


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


class Checkpointer:
  """Save TrainState + data-iterator state (restore.py reads them back); `keep` most recent checkpoints are kept."""

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

  def close(self) -> None:
    """Finish the save being written (a failure raises SaveFailed, unless one was raised already)."""
    try:
      if not self._failed:
        self.check(wait=True)
    finally:
      with contextlib.suppress(Exception):   # after a failed save orbax raises its error again here
        self.manager.close()


@jax.jit
def _all_finite(tree):
  leaves = [jax.numpy.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  return jax.numpy.stack(leaves).all() if leaves else jax.numpy.bool_(True)


def all_finite(tree: Any) -> bool:
  """True when every floating-point array is finite (one compiled reduction, one host sync)."""
  return bool(jax.device_get(_all_finite(tree)))


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
