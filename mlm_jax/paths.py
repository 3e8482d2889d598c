"""Local paths and remote ones (gs://, any tf.io.gfile scheme) behind one set of functions.

TensorFlow is imported only for a remote path. A remote path is not checked for existence before it is opened
(each check is a request to the bucket): `missing` is true only for a local path that does not exist.
"""
from __future__ import annotations

import glob as glob_lib
import os


def is_remote(path: str) -> bool:
  return "://" in path


def _gfile():
  import tensorflow as tf
  return tf.io.gfile


def absolute(path: str) -> str:
  """An absolute local path; a remote path as given."""
  return path if is_remote(path) else os.path.abspath(path)


def missing(path: str) -> bool:
  """True for a local path that does not exist (a remote path is found out when it is read)."""
  return not is_remote(path) and not os.path.exists(path)


def exists(path: str) -> bool:
  return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def glob(pattern: str) -> list[str]:
  """Sorted matches; `~` expanded for local patterns."""
  if is_remote(pattern):
    return sorted(_gfile().glob(pattern))
  return sorted(glob_lib.glob(os.path.expanduser(pattern)))


def open_file(path: str, mode: str = "rb"):
  """A file object (binary by default) for a local or remote path."""
  return _gfile().GFile(path, mode) if is_remote(path) else open(path, mode)


def read_bytes(path: str) -> bytes:
  with open_file(path, "rb") as f:
    return f.read()


def makedirs(path: str) -> None:
  if is_remote(path):
    _gfile().makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def local_size(path: str, default: int = 1) -> int:
  """Bytes of a local file (at least 1); `default` for a remote or unreadable one."""
  if is_remote(path):
    return default
  try:
    return max(1, os.path.getsize(path))
  except OSError:
    return default


def listdir(path: str) -> list[str]:
  """Sorted names in a folder (a remote folder's sub-folders without their trailing '/')."""
  if is_remote(path):
    return sorted(n.rstrip("/") for n in _gfile().listdir(path))
  return sorted(os.listdir(path))


def copy_file(src: str, dst: str) -> None:
  """Copies a file between any two paths, replacing `dst` (an object store's object appears whole)."""
  _gfile().copy(src, dst, overwrite=True)
