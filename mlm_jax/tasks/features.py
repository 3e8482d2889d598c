"""Examples -> fixed-length arrays for classification, sentence pairs and token classification.

Sequences follow the tokenizer's pretraining layout (xlmr / bert); batches are dicts of [N, seq_len]
arrays plus the targets, `weight` 0 on padding rows; NER labels sit on each word's first piece (the
others -1). Layouts and truncation: docs/design_notes.md#features.
"""
from __future__ import annotations

import numpy as np

from mlm_jax.data.tokenizers.base import Tokenizer
from mlm_jax.tasks.readers import DataError, Example


def _empty(n: int, seq_len: int, pad_id: int) -> dict:
  return dict(input_ids=np.full((n, seq_len), pad_id, np.int32), segment_ids=np.zeros((n, seq_len), np.int32),
              positions=np.zeros((n, seq_len), np.int32), token_type_ids=np.zeros((n, seq_len), np.int32),
              weight=np.ones((n,), np.float32))


def _put(arrays: dict, row: int, ids: list, types: list) -> None:
  n = len(ids)
  arrays["input_ids"][row, :n] = ids
  arrays["segment_ids"][row, :n] = 1
  arrays["positions"][row, :n] = np.arange(n)
  arrays["token_type_ids"][row, :n] = types


def join_segments(tok: Tokenizer, a: list, b: list | None, type_b: int) -> tuple[list, list]:
  """(ids, token types) of one or two segments with the layout's special tokens."""
  ids = [tok.bos_id] + a + [tok.eos_id]
  types = [0] * len(ids)
  if b is not None:
    sep = [tok.eos_id] if tok.layout == "bert" else [tok.eos_id, tok.eos_id]
    tail = (sep[1:] if tok.layout != "bert" else []) + b + [tok.eos_id]
    ids, types = ids + tail, types + [type_b] * len(tail)
  return ids, types


def special_count(tok: Tokenizer, pair: bool) -> int:
  if not pair:
    return 2
  return 3 if tok.layout == "bert" else 4


def truncate_pair(a: list, b: list | None, budget: int) -> tuple[list, list | None]:
  """Longest-first: drop the last token of the longer segment until both fit in `budget`."""
  if b is None:
    return a[:budget], None
  a, b = list(a), list(b)
  while len(a) + len(b) > budget:
    if len(a) >= len(b):
      a.pop()
    else:
      b.pop()
  return a, b


def label_vocabulary(examples: list, given=()) -> list:
  """Label names in id order: the config's list, else the sorted labels of the training set."""
  if given:
    return [str(x) for x in given]
  names = sorted({str(e.label) for e in examples if e.label is not None})
  if not names:
    raise DataError("the training data has no labels")
  return names


def encode_classification(examples: list[Example], tok: Tokenizer, seq_len: int, labels: list | None,
                          type_vocab_size: int) -> dict:
  """Arrays for (pairs of) texts; `labels` None means regression (float `target`)."""
  pair = any(e.text_b is not None for e in examples)
  if pair and not all(e.text_b is not None for e in examples):
    raise DataError("some examples have a second text and others do not")
  a_ids = tok.encode_batch([e.text for e in examples])
  b_ids = tok.encode_batch([e.text_b for e in examples]) if pair else [None] * len(examples)
  out = _empty(len(examples), seq_len, tok.pad_id)
  type_b = 1 if type_vocab_size >= 2 else 0
  budget = seq_len - special_count(tok, pair)
  index = {name: i for i, name in enumerate(labels or [])}
  out["label"] = np.zeros((len(examples),), np.int32)
  out["target"] = np.zeros((len(examples),), np.float32)
  for row, (e, a, b) in enumerate(zip(examples, a_ids, b_ids)):
    a, b = truncate_pair(a, b, budget)
    ids, types = join_segments(tok, a, b, type_b)
    _put(out, row, ids, types)
    if e.label is None:
      continue
    if labels is None:
      out["target"][row] = float(e.label)
    elif str(e.label) not in index:
      raise DataError(f"example {e.id}: label {e.label!r} is not one of the task's labels {labels}")
    else:
      out["label"][row] = index[str(e.label)]
  return out


def encode_tokens(examples: list[Example], tok: Tokenizer, seq_len: int, labels: list) -> tuple[dict, list]:
  """Arrays for NER / POS sentences and, per sentence, the position of each kept word's first piece."""
  index = {name: i for i, name in enumerate(labels)}
  out = _empty(len(examples), seq_len, tok.pad_id)
  out["labels"] = np.full((len(examples), seq_len), -1, np.int32)
  starts = []
  for row, e in enumerate(examples):
    pieces = tok.encode_words(e.words)
    ids, first = [tok.bos_id], []
    for word_pieces in pieces:
      word_pieces = word_pieces or [tok.unk_id]   # a word the tokenizer drops (e.g. a lone ZWSP)
      if len(ids) + len(word_pieces) > seq_len - 1:
        break
      first.append(len(ids))
      ids += word_pieces
    ids.append(tok.eos_id)
    _put(out, row, ids, [0] * len(ids))
    for pos, tag in zip(first, e.tags or []):
      if tag not in index:
        raise DataError(f"sentence {e.id}: tag {tag!r} is not one of the task's labels {labels}")
      out["labels"][row, pos] = index[tag]
    starts.append(first)
  return out, starts


def decode_tokens(logits: np.ndarray, starts: list, examples: list[Example], labels: list) -> list[list[str]]:
  """Predicted tag per word ([N, S, L] logits); words beyond the sequence get 'O'."""
  out = []
  for row, (first, e) in enumerate(zip(starts, examples)):
    best = logits[row, first].argmax(-1) if first else np.zeros((0,), np.int64)
    tags = [labels[int(i)] for i in best]
    out.append(tags + ["O"] * (len(e.words) - len(tags)))
  return out


def pad_rows(arrays: dict, multiple: int) -> dict:
  """Appends weight-0 copies of row 0 so the row count is a multiple of `multiple` (eval batches)."""
  n = len(arrays["weight"])
  extra = (-n) % multiple
  if not extra:
    return arrays
  out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in arrays.items()}
  out["weight"][n:] = 0.0
  return out
