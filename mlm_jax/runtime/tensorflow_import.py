"""TensorFlow, imported for tf.data alone: kept off every GPU (JAX owns them), and quiet unless
--verbosity>=1 (its start-up lines go to a file, as `stderr_to` sends other C++ libraries' logs)."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from mlm_jax.runtime.environment import quiet


@contextlib.contextmanager
def stderr_to(path: str):
  """Send the process's fd 2 (where C++ libraries log) to `path` for the block."""
  sys.stderr.flush()
  saved = os.dup(2)
  with open(path, "w") as f:
    os.dup2(f.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def tensorflow():
  """TensorFlow for tf.data, kept off every GPU (JAX owns them); imported quietly unless --verbosity>=1."""
  if "tensorflow" in sys.modules:
    return _hide_gpus(sys.modules["tensorflow"])
  if not quiet():
    import tensorflow as tf
    return _hide_gpus(tf)
  with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
    try:
      with stderr_to(log.name):
        import tensorflow as tf
        _hide_gpus(tf)   # lists devices, which is where a GPU-less host logs cuInit errors
    except Exception:
      sys.stderr.write(log.read())
      raise
  return tf


def _hide_gpus(tf):
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # devices already initialised by an earlier TF user: nothing to change
    pass
  return tf
