"""Minimal pairs of a user's own files (`--tasks=pairs:NAME=GLOB`), and the set of pairs every zero-shot task
(BLiMP, CLAMS, these) is scored in.

A file is TSV with a header row (`.tsv`), CSV with a header row (`.csv`) or JSON lines (`.jsonl`), each
optionally gzipped (`.gz`); the good and bad sentences are in the columns named `good` and `bad` and the
phenomenon in `phenomenon` unless named otherwise (MultiBLiMP: `sen`, `wrong_sen`; RuBLiMP: `source_sentence`,
`target_sentence`). The phenomenon column is optional unless named. A set is the pairs of one phenomenon in
one file, in the file's order. Bad input is one line naming file and line.
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import gzip
import io
import json
import os

from mlm_jax.errors import DataError

COLUMNS = dict(good="good", bad="bad", phenomenon="phenomenon")   # the default column names
FORMATS = (".tsv", ".csv", ".jsonl")


@dataclasses.dataclass(frozen=True)
class PairSet:
  """Minimal pairs scored together: a BLiMP paradigm, a CLAMS file, a phenomenon of a user's file."""
  name: str                  # unique within a task: UID, 'en/simple_agrmt', 'FILE/phenomenon'
  phenomenon: str            # BLiMP's linguistics_term, CLAMS's file name, a file's phenomenon ('' if none)
  good: tuple                # the grammatical sentences
  bad: tuple                 # their ungrammatical twins, pair by pair
  group: str = ""            # CLAMS: the language; a pairs task of several files: the file


def spread(pairs: PairSet, k: int) -> PairSet:
  """`k` pairs of a set at evenly spaced positions (all when k is 0 or the set is smaller): generated sets
  (CLAMS) vary one attribute at a time, so their first pairs would all be alike."""
  n = len(pairs.good)
  if not k or k >= n:
    return pairs
  at = [i * n // k for i in range(k)]
  return dataclasses.replace(pairs, good=tuple(pairs.good[i] for i in at), bad=tuple(pairs.bad[i] for i in at))


def text_of(path: str) -> str:
  """A file's text (gunzipped for .gz); invalid UTF-8 is an error naming the file and line."""
  try:
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
      raw = f.read()
  except (OSError, EOFError) as e:
    raise DataError(f"{path}: unreadable ({e})") from None
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise DataError(f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x}); the file must be UTF-8") from None


def _format(path: str) -> str:
  base = path[:-3] if path.endswith(".gz") else path
  ext = os.path.splitext(base)[1].lower()
  if ext not in FORMATS:
    raise DataError(f"{path}: expected a {', '.join(FORMATS)} file (optionally .gz)")
  return ext


def _rows(path: str, text: str):
  """(line number, {column: value}) of a file's data rows, and its columns (the header's, or the first
  JSON object's keys)."""
  ext = _format(path)
  if ext == ".jsonl":
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
      except ValueError as e:
        raise DataError(f"{path}:{number}: not a JSON object ({e.msg})") from None
      if not isinstance(r, dict):
        raise DataError(f"{path}:{number}: expected a JSON object, got {type(r).__name__}")
      rows.append((number, r))
    return rows, (list(rows[0][1]) if rows else [])
  tsv = ext == ".tsv"
  reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if tsv else ",",
                      quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
  try:
    header = next(reader, None)
    if header is None:
      return [], []
    header = [h.strip() for h in header]
    rows = []
    for row in reader:
      if any(x.strip() for x in row):
        rows.append((reader.line_num, dict(zip(header, row))))
  except csv.Error as e:
    raise DataError(f"{path}:{reader.line_num}: not {'TSV' if tsv else 'CSV'} ({e})") from None
  return rows, header


def read_file(path: str, columns: dict | None = None, limit: int = 0, group: str = "") -> list:
  """The pair sets of one file (one per phenomenon, in order of appearance), `limit` pairs of each spread
  over it (0 = all)."""
  c = dict(COLUMNS, **(columns or {}))
  rows, names = _rows(path, text_of(path))
  if not rows:
    raise DataError(f"{path}: no minimal pairs (an empty file, or a header without rows)")
  what = "field" if path.endswith((".jsonl", ".jsonl.gz")) else "column"
  wanted = [c["good"], c["bad"]] + ([c["phenomenon"]] if c["phenomenon"] != COLUMNS["phenomenon"] else [])
  missing = [k for k in wanted if k not in names]
  if missing:
    flags = "--pairs_good / --pairs_bad / --pairs_phenomenon"
    raise DataError(f"{path}:1: no {what} {missing[0]!r} (its {what}s: {', '.join(map(str, names))}; name the "
                    f"columns with {flags})")
  has_phenomenon = c["phenomenon"] in names
  sets = {}
  for number, r in rows:
    good, bad = r.get(c["good"]), r.get(c["bad"])
    if not (isinstance(good, str) and good.strip() and isinstance(bad, str) and bad.strip()):
      raise DataError(f"{path}:{number}: a row without both sentences ({c['good']}={good!r}, {c['bad']}={bad!r})")
    term = str(r.get(c["phenomenon"]) or "") if has_phenomenon else ""
    sets.setdefault(term, []).append((good.strip(), bad.strip()))
  prefix = f"{group}/" if group else ""
  return [spread(PairSet(f"{prefix}{term}" if term else (group or os.path.basename(path)), term,
                         tuple(g for g, _ in p), tuple(b for _, b in p), group), limit) for term, p in sets.items()]


def files(pattern: str) -> list:
  paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
  if not paths:
    raise DataError(f"{pattern}: no files match (minimal pairs: .tsv, .csv or .jsonl, optionally .gz)")
  return paths


def labels(paths: list) -> list:
  """A short name per file: its path below the folder all share, without the extension
  (`eng/data` for MultiBLiMP's data/eng/data.tsv beside data/deu/data.tsv)."""
  root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
  out = []
  for p in paths:
    rel = os.path.relpath(os.path.abspath(p), root)
    rel = rel[:-3] if rel.endswith(".gz") else rel
    out.append(os.path.splitext(rel)[0])
  return out


def read(pattern: str, columns: dict | None = None, limit: int = 0) -> list:
  """The pair sets of every file matching `pattern`; with several files, each set's group is its file."""
  paths = files(pattern)
  names = labels(paths) if len(paths) > 1 else [""]
  if len(set(names)) < len(names):
    twin = next(n for n in names if names.count(n) > 1)
    raise DataError(f"{pattern}: two files are both {twin!r} without their extension; keep one")
  return [s for p, g in zip(paths, names) for s in read_file(p, columns, limit, g)]
