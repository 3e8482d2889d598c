"""The demo's corpus: Python's own documentation (pydoc topics and standard-library docstrings, read with
`ast`), so the demo needs no network and no ../shared; one document per line, in a fixed order.
"""
from __future__ import annotations

import ast
import os
import re
import sysconfig

_SPACE = re.compile(r"\s+")


def _docstrings(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc and len(doc) > 200:
        yield doc


def documents(max_bytes: int = 4_000_000):
  """Yields documents (single-line strings) until about `max_bytes` of text."""
  total = 0
  try:
    from pydoc_data.topics import topics
  except ImportError:  # some distributions strip it; the docstrings suffice
    topics = {}
  stdlib = sysconfig.get_paths()["stdlib"]
  sources = []
  for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
    sources += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
  texts = (topics[k] for k in sorted(topics))
  for text in list(texts) + [d for p in sources for d in _docstrings(p)]:
    doc = _SPACE.sub(" ", text).strip()
    if not doc:
      continue
    yield doc
    total += len(doc)
    if total >= max_bytes:
      return


def topics() -> list:
  """The language reference part alone (pydoc topics): the phase demo's decay source."""
  try:
    from pydoc_data.topics import topics as pages
  except ImportError:
    return []
  return [d for d in (_SPACE.sub(" ", pages[k]).strip() for k in sorted(pages)) if d]


def write_topics(directory: str) -> str:
  """Writes DIRECTORY/pydoc_topics.txt once (empty where the distribution strips pydoc_data)."""
  path = os.path.join(directory, "pydoc_topics.txt")
  if not os.path.exists(path):
    os.makedirs(directory, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.writelines(doc + "\n" for doc in topics())
    os.replace(path + ".tmp", path)
  return path


def write(directory: str, max_bytes: int = 4_000_000) -> str:
  """Writes DIRECTORY/python_docs.txt once (kept if it exists, so a resumed run reads the same file)."""
  path = os.path.join(directory, "python_docs.txt")
  if os.path.exists(path):
    return path
  os.makedirs(directory, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for doc in documents(max_bytes):
      f.write(doc + "\n")
  os.replace(tmp, path)
  return path
