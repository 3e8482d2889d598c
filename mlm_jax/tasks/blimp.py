"""BLiMP (Warstadt et al., 2020): 67 paradigms of minimal pairs, DATA/zeroshot/blimp/UID.jsonl.gz.

Each line holds sentence_good, sentence_bad, linguistics_term (one of 12 phenomena) and UID (the paradigm);
published_results.jsonl holds the paper's accuracies per paradigm (5-gram, LSTM, Transformer-XL, GPT-2).
"""
from __future__ import annotations

import glob
import gzip
import json
import os

from mlm_jax.errors import DataError
from mlm_jax.tasks.minimal_pairs import PairSet as Paradigm   # name: UID; phenomenon: linguistics_term

FOLDER = os.path.join("zeroshot", "blimp")
PUBLISHED = "published_results.jsonl"
FIELDS = ("sentence_good", "sentence_bad", "linguistics_term", "UID")
# The paper's rows (published_results.jsonl's keys), as the table names them.
PUBLISHED_ROWS = dict(ngram="5-gram", lstm="LSTM", txl="Transformer-XL", gpt2="GPT-2")


def folder(data: str) -> str:
  return os.path.join(data, FOLDER)


def _paths(where: str) -> list:
  if not os.path.isdir(where):
    raise DataError(f"{where}: no such folder (BLiMP's paradigms, *.jsonl.gz; see ../shared/data/SOURCES.md)")
  paths = sorted(glob.glob(os.path.join(where, "*.jsonl.gz")))
  if not paths:
    raise DataError(f"{where}: no *.jsonl.gz paradigm files (BLiMP's 67 paradigms expected)")
  return paths


def _record(path: str, number: int, line: str) -> dict:
  try:
    r = json.loads(line)
  except ValueError as e:
    raise DataError(f"{path}:{number}: not a JSON object ({e.msg})") from None
  if not isinstance(r, dict) or any(not isinstance(r.get(k), str) or not r.get(k) for k in FIELDS):
    raise DataError(f"{path}:{number}: expected a JSON object with non-empty strings {', '.join(FIELDS)}")
  return r


def read_paradigm(path: str, limit: int = 0) -> Paradigm:
  """The first `limit` pairs (0 = all) of one paradigm file; a bad line is an error naming file and line."""
  records = []
  try:
    with gzip.open(path, "rt", encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if limit and len(records) >= limit:
          break
        if line.strip():
          records.append(_record(path, number, line))
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: unreadable ({e})") from None
  if not records:
    raise DataError(f"{path}: no minimal pairs")
  first = records[0]
  return Paradigm(first["UID"], first["linguistics_term"], tuple(r["sentence_good"] for r in records),
                  tuple(r["sentence_bad"] for r in records))


def read(where: str, limit: int = 0, paradigms: int = 0) -> list:
  """Every paradigm of the folder (or the first `paradigms`, by name), `limit` pairs each (0 = all)."""
  paths = _paths(where)
  return [read_paradigm(p, limit) for p in (paths[:paradigms] if paradigms else paths)]


def published(where: str) -> dict:
  """{row name: {key: accuracy}} of the paper's models, keyed by paradigm (UID), phenomenon and 'overall'
  (the file's summary rows, UID 'overall'); empty without the file."""
  path = os.path.join(where, PUBLISHED)
  if not os.path.exists(path):
    return {}
  out = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
        for key, row in PUBLISHED_ROWS.items():
          name = r["linguistics_term"] if r["UID"] == "overall" else r["UID"]
          out.setdefault(row, {})[name] = float(r[key])
      except (ValueError, KeyError, TypeError):
        raise DataError(f"{path}:{number}: expected UID and {', '.join(PUBLISHED_ROWS)} accuracies") from None
  return out
