"""How a binary or tool ends: what a normal exit does that keeps output, without the interpreter's
teardown (docs/design_notes.md#runtime)."""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import NoReturn


def exit_now(code=0) -> NoReturn:
  """Ends the process as `sys.exit(code)` would, without the interpreter's teardown.

  A binary's teardown (freeing every module's objects, then TensorFlow's and XLA's C++ destructors)
  took ~2 s after its last line on a 2-core VM, for nothing: what a normal exit does that keeps
  output is done here first, in its order: non-daemon threads joined (threading's own shutdown,
  which also stops concurrent.futures pools), the atexit handlers (logging's flush and close,
  jax.distributed's shutdown barrier, weakref finalizers: store workers, temporary folders), then
  Python's and C's stdio buffers flushed. The status is sys.exit's (`exit_status`). Only a process's
  last call: tests/test_train.py checks that a run's metrics, TensorBoard events and checkpoints are
  whole after it.
  """
  status = exit_status(code)
  shutdown = getattr(threading, "_shutdown", None)   # what Py_Finalize calls first
  if shutdown is not None:
    shutdown()
  atexit._run_exitfuncs()
  flush_all()
  os._exit(status)


def exit_status(code) -> int:
  """sys.exit's status for `code`: None 0, an int itself, anything else printed to stderr (its
  message) and 1."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def flush_all() -> None:
  """Python's and C's buffered output (a pipe's is block-buffered), and absl's log."""
  if "absl.logging" in sys.modules:
    sys.modules["absl.logging"].flush()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, AttributeError):   # closed, or a broken pipe: nothing left to keep
      pass
  try:
    ctypes.CDLL(None).fflush(None)   # C libraries' buffered stdout (a pipe's is block-buffered)
  except (OSError, AttributeError):
    pass
