"""A checkpoint save that failed, as one line: where, why (no space left, a file-size limit), how much
it needed, which checkpoint is intact; its half-written `<step>.orbax-checkpoint-tmp*` folder removed.

orbax writes a save in background threads and logs each failing thread's traceback; the loop checks
the save at every step (`Checkpointer.check`), so the first failed save stops the run at once.
"""
from __future__ import annotations

import os
import re
import shutil

from mlm_jax import paths
from mlm_jax.errors import CheckpointError


class SaveFailed(CheckpointError):
  """A checkpoint could not be written (full disk, quota, file-size limit, lost permission)."""


def _why(text: str) -> str:
  if "No space left" in text or "RESOURCE_EXHAUSTED" in text or "ENOSPC" in text or "Disk quota" in text:
    return "no space left on device"
  if "File too large" in text or "EFBIG" in text:
    return "file too large, over a file-size limit (ulimit -f)"
  if "Permission denied" in text or "Read-only file system" in text:
    return "the checkpoint folder is not writable"
  return " ".join(text.split())[:300]


def _megabytes(n: int) -> str:
  return f"{n / 1e6:.1f} MB"


def remove_partial(directory: str, step: int) -> list[str]:
  """Remove the temporary folders of step's save (orbax's `<step>.orbax-checkpoint-tmp*`); their names."""
  prefix = f"{step}.orbax-checkpoint-tmp"
  removed = []
  for path in paths.glob(os.path.join(directory, prefix + "*")):
    try:
      if paths.is_remote(path):
        import tensorflow as tf
        tf.io.gfile.rmtree(path)
      else:
        shutil.rmtree(path)
      removed.append(path)
    except OSError:
      pass
  return removed


def failed_save(directory: str, step: int, size: int, error: BaseException, committed: list) -> SaveFailed:
  """The one-line error of a failed save of checkpoint `step` (`size` bytes uncompressed)."""
  chain, e = [], error
  while e is not None and len(chain) < 8:
    chain.append(f"{type(e).__name__}: {e}")
    e = e.__cause__ or e.__context__
  text = "\n".join(chain)
  removed = remove_partial(directory, step)
  wrote = re.search(r"Failed to write (\d+) bytes", text)
  need = f"the checkpoint needs up to {_megabytes(size)}"
  if wrote:
    need += f"; a write of {_megabytes(int(wrote.group(1)))} failed"
  if not paths.is_remote(directory):
    try:
      need += f"; {_megabytes(shutil.disk_usage(directory).free)} free without it"
    except OSError:
      pass
  left = [s for s in committed if s != step]
  intact = f"the last good checkpoint, {left[-1]}, is intact" if left else "no earlier checkpoint exists"
  tidy = "its partial folder was removed" if removed else "no partial folder was left"
  return SaveFailed(f"checkpoint {directory}/{step} could not be saved: {_why(text)} ({need}); training stopped, "
                    f"{intact} and {tidy}. Free space (or copy the workdir to a bigger disk) and rerun to resume")
