"""What identifies a source's content, not its place: a resumed run checks that it reads the same data.

A text source is its files, named relative to their glob's root (the folder before the first wildcard),
each with its size and the sha256 of its first and last 64 KiB; TFDS names stay as written. A corpus
moved or copied to another disk, bucket or host is then the same source, and an edited, added or
removed file is a different one. More in docs/resume.md#portable-workdirs.
"""
from __future__ import annotations

import hashlib
import json
import re

from mlm_jax.data import specs

SAMPLE_BYTES = 1 << 16   # hashed at each end of a file: a cheap read, also of gs:// files


def digest(key: dict) -> str:
  """The 16 hex digits a data state names its stream by: the sha256 of `key` as sorted JSON."""
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def glob_root(glob: str) -> str:
  """The folder of `glob` before its first wildcard ('' for a bare file name)."""
  head = re.split(r"[*?\[]", glob, maxsplit=1)[0]
  return head.rsplit("/", 1)[0] if "/" in head else ""


def relative(path: str, root: str) -> str:
  return path[len(root) + 1:] if root and path.startswith(root + "/") else path.rsplit("/", 1)[-1]


def file_identity(path: str) -> list:
  """[size, sha256 of the first and last SAMPLE_BYTES] of a local or remote file."""
  from mlm_jax import runtime
  gfile = runtime.tensorflow().io.gfile
  size = gfile.stat(path).length
  digest = hashlib.sha256()
  with gfile.GFile(path, "rb") as f:
    digest.update(f.read(SAMPLE_BYTES))
    if size > SAMPLE_BYTES:
      f.seek(max(size - SAMPLE_BYTES, SAMPLE_BYTES))
      digest.update(f.read(SAMPLE_BYTES))
  return [size, digest.hexdigest()[:16]]


def source_identity(entry: str):
  """One `data.sources` entry as what its batches depend on: for files, [relative name, size, hash]
  of each file its globs match; a TFDS entry as written (a dataset name is not a place)."""
  name, spec_str = specs.split_named(entry)
  spec = specs.parse_spec(spec_str)
  if spec.kind == "tfds":
    return entry
  files = []
  for glob in (g.strip() for g in spec.pattern.split(",")):
    root = glob_root(glob)
    files.extend([relative(f, root), *file_identity(f)] for f in specs.list_files(glob, entry))
  return dict(name=name, kind=spec.kind, arg=spec.arg, files=files)
