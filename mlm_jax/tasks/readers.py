"""Labeled examples from local files in the common formats, as plain Python records.

TSV / CSV / JSON lines, one file per class, CoNLL, CoNLL-U, TREC and SQuAD v1.1; .gz and remote paths read too,
invalid UTF-8 replaced, every error naming the file and line. The formats: docs/design_notes.md#readers.
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
from typing import Sequence

from mlm_jax.config import choices
from mlm_jax import errors, paths


# "# key = value" lines of CoNLL-U; a '#' token line ("#\tO") is data.
_COMMENT = re.compile(r"#\s*[\w ]+?\s*=\s")
_SENT_ID = re.compile(r"#\s*sent_id\s*=\s*(\S+)")
_WORD_ID = re.compile(r"\d+$")          # CoNLL-U ids of syntactic words (not 3-4 ranges, not 3.1 empty nodes)


DataError = errors.DataError


@dataclasses.dataclass
class Example:
  """One classification / regression example, or one NER sentence, or one QA question."""
  id: str
  text: str = ""
  text_b: str | None = None
  label: object = None               # class name (str) or target (float); None when unlabeled
  words: list | None = None          # NER: the words of the sentence
  tags: list | None = None           # NER: one tag per word
  context: str = ""                  # QA: the paragraph
  answers: list | None = None        # QA: [{"text", "answer_start"}]
  group: str = ""                    # what the held-out split hashes (QA: the article title)


def expand(patterns: Sequence[str]) -> list[str]:
  """Globs -> sorted paths; a pattern matching nothing is an error naming it."""
  out = []
  for pattern in patterns:
    found = paths.glob(pattern)
    if not found:
      raise DataError(f"{pattern}: no such file")
    out += found
  return out


def read_text(path: str) -> str:
  raw = paths.read_bytes(path)
  if path.endswith(".gz"):
    raw = gzip.decompress(raw)
  return raw.decode("utf-8-sig", errors="replace")


def held_out(key: str, percent: float) -> bool:
  """Stable split: the same example is held out on every run, host and Python version."""
  h = int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big")
  return (h % 10000) < percent * 100


def _field(row, field: str, path: str, line: int):
  if isinstance(row, dict):
    if field not in row:
      raise DataError(f"{path}:{line}: no field {field!r} (has {', '.join(map(str, row))})")
    return row[field]
  try:
    return row[int(field)]
  except ValueError:
    raise DataError(f"{path}: field {field!r} is a name, but the file has no header (task.header=False); "
                    "give a column number") from None
  except IndexError:
    raise DataError(f"{path}:{line}: no column {field} (the line has {len(row)})") from None


def read_table(paths: Sequence[str], fmt: str, text_field: str, label_field: str, text_b_field: str = "",
               header: bool = False, regression: bool = False) -> list[Example]:
  """Rows of TSV / CSV / JSONL files, or the lines of per-class text files (`fmt='lines'`)."""
  out = []
  if fmt == "lines":
    for spec in paths:
      if "=" not in spec:
        raise DataError(f"{spec}: format 'lines' needs LABEL=PATH (one file per class)")
      label, pattern = spec.split("=", 1)
      for path in expand([pattern]):
        for i, line in enumerate(read_text(path).splitlines(), 1):
          if line.strip():
            out.append(Example(id=f"{os.path.basename(path)}:{i}", text=line.strip(), label=label,
                               group=line.strip()))
    return out
  choices.check("task.format", fmt)
  for path in expand(paths):
    text = read_text(path)
    if fmt == "jsonl":
      rows = []
      for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
          try:
            rows.append((i, json.loads(line)))
          except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: not JSON ({e.msg})") from None
    else:
      reader = csv.reader(io.StringIO(text), delimiter="\t" if fmt == "tsv" else ",",
                          quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
      rows = [(i, r) for i, r in enumerate(reader, 1) if r and any(c.strip() for c in r)]
      if header and rows:
        names = rows[0][1]
        rows = [(i, dict(zip(names, r))) for i, r in rows[1:]]
    for i, row in rows:
      label = _field(row, label_field, path, i) if label_field else None
      if regression and label is not None:
        try:
          label = float(label)
        except (TypeError, ValueError):
          raise DataError(f"{path}:{i}: regression target {label!r} is not a number") from None
      elif label is not None:
        label = str(label)
      a = str(_field(row, text_field, path, i))
      b = str(_field(row, text_b_field, path, i)) if text_b_field else None
      out.append(Example(id=f"{os.path.basename(path)}:{i}", text=a, text_b=b, label=label, group=a + (b or "")))
  return out


def read_conll(paths: Sequence[str], token_column: int = 0, tag_column: int = -1) -> list[Example]:
  """Sentences of CoNLL-column files as Examples with `words` and `tags`."""
  out = []
  need = max(token_column, tag_column) + 1 if tag_column >= 0 else max(token_column + 1, 2)
  for path in expand(paths):
    words, tags, start = [], [], 0
    lines = read_text(path).splitlines() + [""]
    for i, line in enumerate(lines, 1):
      if not line.strip():
        if words:
          out.append(Example(id=f"{os.path.basename(path)}:{start}", words=words, tags=tags,
                             text=" ".join(words), group=" ".join(words)))
        words, tags = [], []
        continue
      if _COMMENT.match(line):   # CoNLL-U comment (# sent_id = ..., # text = ...)
        continue
      cols = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()
      if len(cols) < need:
        raise DataError(f"{path}:{i}: expected at least {need} columns (token in column {token_column}, tag in "
                        f"column {tag_column}), got {len(cols)}: {line[:80]!r}")
      if cols[token_column] == "-DOCSTART-":
        continue
      if not words:
        start = i
      words.append(cols[token_column])
      tags.append(cols[tag_column].strip())
  return out


def read_squad(paths: Sequence[str]) -> list[Example]:
  """Questions of SQuAD v1.1 JSON files; every answer's `answer_start` is checked against its context."""
  out = []
  for path in expand(paths):
    try:
      data = json.loads(read_text(path))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise DataError(f"{path}: not SQuAD JSON ({type(e).__name__}: {e})") from None
    for article in data:
      title = str(article.get("title", ""))
      for p, para in enumerate(article["paragraphs"]):
        context = para["context"]
        for qa in para["qas"]:
          answers = list(qa.get("answers", []))
          for a in answers:
            s = int(a["answer_start"])
            if context[s:s + len(a["text"])] != a["text"]:
              raise DataError(f"{path}: question {qa['id']}: answer {a['text']!r} is not at answer_start={s}")
          out.append(Example(id=str(qa["id"]), text=qa["question"], context=context, answers=answers,
                             group=title or f"{path}:{p}"))
  return out


def read_conllu(paths: Sequence[str], tag_column: int = 3, token_column: int = 1) -> list[Example]:
  """Sentences of CoNLL-U files (UPOS tags by default), grouped by `sent_id` (see the module doc)."""
  out = []
  for path in expand(paths):
    words, tags, sent_id, start = [], [], "", 0
    for i, line in enumerate(read_text(path).splitlines() + [""], 1):
      if not line.strip():
        if words:
          key = sent_id or f"{os.path.basename(path)}:{start}"
          out.append(Example(id=key, words=words, tags=tags, text=" ".join(words), group=key))
        words, tags, sent_id = [], [], ""
        continue
      if line.startswith("#"):
        m = _SENT_ID.match(line)
        sent_id = m.group(1) if m else sent_id
        continue
      cols = line.rstrip("\r\n").split("\t")
      if len(cols) != 10:
        raise DataError(f"{path}:{i}: a CoNLL-U word line has 10 tab-separated columns, got {len(cols)}: "
                        f"{line[:80]!r}")
      if not _WORD_ID.match(cols[0]):   # multiword token range or empty node
        continue
      if not words:
        start = i
      words.append(cols[token_column])
      tags.append(cols[tag_column])
  return out


def read_trec(paths: Sequence[str], fine: bool = False) -> list[Example]:
  """TREC question classification lines `COARSE:fine question`; the label is COARSE (or COARSE:fine)."""
  out = []
  for path in expand(paths):
    for i, line in enumerate(read_text(path).splitlines(), 1):
      if not line.strip():
        continue
      label, _, text = line.strip().partition(" ")
      if ":" not in label or not text:
        raise DataError(f"{path}:{i}: expected 'COARSE:fine question', got {line[:80]!r}")
      text = text.strip()
      out.append(Example(id=f"{os.path.basename(path)}:{i}", text=text, label=label if fine else label.split(":")[0],
                         group=text))
  return out
