"""Plain-Python reading of text sources for prepare: files -> cleaned documents, bounded memory.

The streaming path's cleaning (text/sources.py) without TensorFlow: repairs are counted, and with
`strict=True` (data.strict) any of them is a DataError. What it repairs: docs/design_notes.md#text_reader.
"""
import gzip
import io
import logging
import zlib
from typing import Iterator

from mlm_jax import paths
from mlm_jax.data import jsonl
from mlm_jax.data.specs import MAX_BLOCK_CHARS
from mlm_jax.errors import DataError

REPAIRS = ("invalid_utf8_lines", "long_lines_cut", "long_blocks_split", "truncated_files",
           "empty_files", "empty_docs", "bad_json_records")
# Repairs that `strict` does not refuse: blank lines are how text files look.
_BENIGN = ("empty_docs",)


class Counters(dict):
  """Repair counts of one read; `strict` turns the first repair into a one-line error."""

  def __init__(self, strict: bool = False):
    super().__init__({k: 0 for k in REPAIRS})
    self.strict = strict

  def add(self, key: str, path: str, detail: str = "") -> None:
    if self.strict and key not in _BENIGN:
      raise DataError(f"{path}: {key.replace('_', ' ')}{detail} (data.strict=True refuses "
                      "repaired or skipped input)")
    self[key] += 1


def open_binary(path: str):
  """A binary file object for a local path or any tf.io.gfile path (gs://...)."""
  return paths.open_file(path, "rb")


def _raw_lines(f, path: str, limit: int, counters: Counters) -> Iterator[tuple]:
  """(bytes piece, continues_previous) of at most `limit` bytes, cut at UTF-8 boundaries."""
  carry, cont = b"", False
  while True:
    try:
      piece = f.readline(limit - len(carry)) if limit else f.readline()
    except EOFError:
      logging.warning("%s is truncated (gzip stream ends early): keeping its readable part", path)
      counters.add("truncated_files", path, ": the gzip stream ends early")
      piece = b""
    except (OSError, zlib.error) as e:
      raise DataError(f"cannot read {path}: {e.__class__.__name__}: {e}") from None
    piece = carry + piece
    if not piece:
      return
    carry = b""
    if not piece.endswith(b"\n") and limit and len(piece) >= limit:
      cut = _char_boundary(piece)
      piece, carry = piece[:cut], piece[cut:]
      yield piece, cont
      cont = True
      continue
    yield piece, cont
    cont = False


def _char_boundary(b: bytes) -> int:
  """The largest cut <= len(b) that does not split a UTF-8 character."""
  i = len(b)
  for back in range(1, min(4, len(b)) + 1):
    c = b[-back]
    if c & 0xC0 != 0x80:       # a lead byte (or ASCII): is its character complete?
      need = 1 if c < 0x80 else 2 if c >> 5 == 6 else 3 if c >> 4 == 14 else 4
      return i if back >= need else i - back
  return i


def lines(path: str, field, max_line_bytes: int, counters: Counters) -> Iterator[str]:
  """Cleaned lines of one file ('' for blank ones): all of each line (field -1), its TSV column (an
  int >= 0), or for JSON lines (a str) the lines of each record's field."""
  with open_binary(path) as raw:
    f = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else io.BufferedReader(raw)
    try:
      first = f.peek(1) if hasattr(f, "peek") else b"x"
    except (OSError, EOFError, zlib.error) as e:
      raise DataError(f"cannot read {path}: {e.__class__.__name__}: {e}") from None
    if not first:
      logging.warning("skipping empty file %s", path)
      counters.add("empty_files", path)
      return
    if isinstance(field, str):
      yield from _json_lines(f, path, field, max_line_bytes, counters)
      return
    for piece, cont in _raw_lines(f, path, max_line_bytes, counters):
      if cont:
        counters.add("long_lines_cut", path, f": a line over data.max_line_bytes={max_line_bytes}")
        if field >= 0:
          continue
      text = piece.decode("utf-8", errors="replace")
      if "\ufffd" in text and "\ufffd".encode() not in piece:
        counters.add("invalid_utf8_lines", path, ": invalid UTF-8")
      text = text.rstrip("\n").rstrip("\r").lstrip("\ufeff")
      if field >= 0 and not cont:
        cols = text.split("\t")
        text = cols[field] if field < len(cols) else ""
      yield text


def _json_lines(f, path: str, field: str, max_line_bytes: int, counters: Counters) -> Iterator[str]:
  """The lines of each record's `field` (data/jsonl.py), each cut to `max_line_bytes` as a text line is.

  A record is read whole (it is parsed whole): the byte limit applies to the lines of its text.
  """
  for n, (piece, _) in enumerate(_raw_lines(f, path, 0, counters), 1):
    text = piece.decode("utf-8", errors="replace")
    if "\ufffd" in text and "\ufffd".encode() not in piece:
      counters.add("invalid_utf8_lines", path, ": invalid UTF-8")
    got = jsonl.record_lines(text, field)
    if got is None:
      counters.add("bad_json_records", path, f": line {n} is not a JSON object with a string {field!r}")
      continue
    for line in got:
      line = line.rstrip("\r").lstrip("\ufeff")
      data = line.encode("utf-8")
      if not max_line_bytes or len(data) <= max_line_bytes:
        yield line
        continue
      counters.add("long_lines_cut", path, f": a line over data.max_line_bytes={max_line_bytes}")
      while data:
        cut = _char_boundary(data[:max_line_bytes])
        yield data[:cut].decode("utf-8")
        data = data[cut:]


def documents(path: str, field, doc_format: str, max_line_bytes: int,
              counters: Counters) -> Iterator[list]:
  """Documents of one file, each a list of its non-blank lines (sentences)."""
  block, size = [], 0
  for line in lines(path, field, max_line_bytes, counters):
    blank = not line.strip()
    if doc_format == "line":
      if blank:
        counters.add("empty_docs", path)
      else:
        yield [line]
      continue
    if not blank:
      block.append(line)
      size += len(line) + 1
    if block and (blank or size >= MAX_BLOCK_CHARS):
      if not blank:
        counters.add("long_blocks_split", path, f": a block over {MAX_BLOCK_CHARS} characters")
      yield block
      block, size = [], 0
  if block:
    yield block
