"""The workdir lock: one run writes a workdir at a time.

WORKDIR/lock.json names the holder (host, pid, start time). Process 0 takes it before the run writes
anything and removes it at exit; a second run stops with one line naming the holder. A lock left by a
run that died (kill -9, a lost host) is stale, and taken over with a warning, when its process is gone
from this host, or when it is older than `train.lock_stale_hours` (0 = never by age).
Locally the file is created exclusively (O_EXCL); on gs:// and other remote paths tf.io.gfile has no
create-if-absent, so two runs started within the same moment can both take it: a check, not a guarantee.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time

from absl import logging

from mlm_jax import paths
from mlm_jax.errors import CheckpointError

LOCK_FILE = "lock.json"


def holder_line(holder: dict) -> str:
  start = datetime.datetime.fromtimestamp(holder.get("start", 0), datetime.timezone.utc)
  return f"host {holder.get('host')}, pid {holder.get('pid')}, started {start:%Y-%m-%d %H:%M:%S} UTC"


def _me() -> dict:
  return dict(host=socket.gethostname(), pid=os.getpid(), start=time.time())


def _pid_gone(pid: int) -> bool:
  """Whether no process `pid` runs on this host (a zombie has ended: its parent just has not reaped it)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except (OSError, IndexError):
    return False


def stale_reason(holder: dict, stale_hours: float, now: float | None = None) -> str:
  """Why `holder`'s lock no longer holds ('' while it does)."""
  if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and _pid_gone(holder["pid"]):
    return "its process is gone"
  age = ((time.time() if now is None else now) - float(holder.get("start", 0))) / 3600
  if stale_hours > 0 and age > stale_hours:
    return f"it is {age:.1f} h old (train.lock_stale_hours={stale_hours:g})"
  return ""


def _read(path: str) -> dict | None:
  try:
    with paths.open_file(path, "r") as f:
      holder = json.loads(f.read())
  except (OSError, ValueError):
    return None
  return holder if isinstance(holder, dict) else {}


def _create(path: str, me: dict) -> bool:
  """Write the lock if there is none; False if one is there."""
  text = json.dumps(me, sort_keys=True)
  if paths.is_remote(path):
    if paths.exists(path):
      return False
    with paths.open_file(path, "w") as f:
      f.write(text)
    return True
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w") as f:
    f.write(text)
  return True


def _remove(path: str) -> None:
  if paths.is_remote(path):
    from mlm_jax import runtime
    runtime.tensorflow().io.gfile.remove(path)
  else:
    os.remove(path)


def acquire(workdir: str, stale_hours: float) -> dict:
  """Take WORKDIR's lock (the workdir exists); returns what it holds. Raises CheckpointError naming the
  holder when another live run has it."""
  path = os.path.join(workdir, LOCK_FILE)
  me = _me()
  for _ in range(3):   # a stale lock removed, then created: another run may win the race in between
    if _create(path, me):
      return me
    holder = _read(path)
    if holder is None:   # removed meanwhile (its run ended): try again
      continue
    reason = stale_reason(holder, stale_hours) if holder else "it cannot be read"
    if not reason:
      raise CheckpointError(f"workdir {workdir} is in use by another run ({holder_line(holder)}; {path}): "
                            "two runs would write the same checkpoints; stop that run, or wait for it (if it no longer runs, "
                            f"e.g. its host was lost, remove {LOCK_FILE})")
    logging.warning("workdir %s: taking over the lock of %s: %s", workdir, holder_line(holder) if holder else path,
                    reason)
    with contextlib.suppress(OSError):
      _remove(path)
  raise CheckpointError(f"workdir {workdir}: could not take the lock {path} (other runs keep taking it)")


def release(workdir: str, me: dict) -> None:
  """Remove WORKDIR's lock if it is still `me`'s (a run that took it over keeps its own)."""
  path = os.path.join(workdir, LOCK_FILE)
  if _read(path) == me:
    with contextlib.suppress(OSError):
      _remove(path)


@contextlib.contextmanager
def held(workdir: str, stale_hours: float, process_index: int = 0):
  """The lock for the block, taken by process 0 only (a multi-host run holds it once)."""
  if process_index != 0:
    yield None
    return
  me = acquire(workdir, stale_hours)
  try:
    yield me
  finally:
    release(workdir, me)
