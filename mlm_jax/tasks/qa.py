"""Extractive QA: SQuAD questions -> windowed features, and start/end logits -> answer text.

Long paragraphs become windows `doc_stride` apart; answers map to and from the tokenizer's character offsets
(an exact slice of the paragraph), and `best_span` never returns an invalid span (docs/design_notes.md#qa).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from mlm_jax.data.tokenizers.base import Tokenizer
from mlm_jax.errors import ConfigError
from mlm_jax.tasks import features
from mlm_jax.tasks.readers import Example


@dataclasses.dataclass
class Feature:
  example: int                 # index of the question in the example list
  char_spans: dict             # feature position -> (first char, end char) in the context, context pieces only


def context_pieces(tok: Tokenizer, text: str) -> tuple[list, list]:
  """(ids, [(first char, end char)]) of `text`, from the tokenizer's own offsets."""
  return tok.encode_offsets(text)


def _answer_pieces(spans: list, start_char: int, end_char: int) -> tuple[int, int] | None:
  first = next((k for k, (s, e) in enumerate(spans) if e > start_char), None)
  last = next((k for k in range(len(spans) - 1, -1, -1) if spans[k][0] < end_char), None)
  if first is None or last is None or last < first:
    return None
  return first, last


def encode(examples: list[Example], tok: Tokenizer, seq_len: int, type_vocab_size: int,
           max_query_length: int = 64, doc_stride: int = 128) -> tuple[dict, list[Feature]]:
  """Arrays (with start_position / end_position) for every window of every question, and their Features."""
  type_b = 1 if type_vocab_size >= 2 else 0
  questions = tok.encode_batch([e.text for e in examples])
  cache = {}
  rows, feats = [], []
  for n, (e, q) in enumerate(zip(examples, questions)):
    q = q[:max_query_length]
    if e.context not in cache:
      cache[e.context] = context_pieces(tok, e.context)
    c_ids, c_spans = cache[e.context]
    room = seq_len - len(q) - features.special_count(tok, True)
    if room < 8:
      raise ConfigError(f"data.seq_len={seq_len} leaves {room} tokens for the context after a question of "
                        f"{len(q)}: raise seq_len or lower task.max_query_length")
    answer = None
    if e.answers:
      a = e.answers[0]
      answer = _answer_pieces(c_spans, int(a["answer_start"]), int(a["answer_start"]) + len(a["text"]))
    offset = len(features.join_segments(tok, q, [], type_b)[0]) - 1   # context starts here in the row
    start = 0
    while True:
      window = list(range(start, min(start + room, len(c_ids))))
      ids, types = features.join_segments(tok, q, [c_ids[k] for k in window], type_b)
      s_pos = e_pos = 0
      if answer is not None and window and window[0] <= answer[0] and answer[1] <= window[-1]:
        s_pos, e_pos = answer[0] - start + offset, answer[1] - start + offset
      rows.append((ids, types, s_pos, e_pos))
      feats.append(Feature(example=n, char_spans={offset + i: c_spans[k] for i, k in enumerate(window)}))
      if start + room >= len(c_ids):
        break
      start += min(doc_stride, room)
  out = features._empty(len(rows), seq_len, tok.pad_id)
  out["start_position"] = np.zeros((len(rows),), np.int32)
  out["end_position"] = np.zeros((len(rows),), np.int32)
  for r, (ids, types, s, t) in enumerate(rows):
    features._put(out, r, ids, types)
    out["start_position"][r], out["end_position"][r] = s, t
  return out, feats


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, valid: np.ndarray,
              max_answer_length: int) -> tuple[int, int, float] | None:
  """(start, end, score) maximizing start[i] + end[j] over valid i <= j < i + max_answer_length; None if none."""
  if max_answer_length < 1:
    raise ConfigError(f"max_answer_length={max_answer_length}: expected >= 1")
  idx = np.flatnonzero(valid)
  if idx.size == 0:
    return None
  s, e = start_logits[idx].astype(np.float64), end_logits[idx].astype(np.float64)
  gap = idx[None, :] - idx[:, None]           # end position - start position
  ok = (gap >= 0) & (gap < max_answer_length)
  scores = np.where(ok, s[:, None] + e[None, :], -np.inf)
  i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
  return int(idx[i]), int(idx[j]), float(scores[i, j])


def decode(start_logits: np.ndarray, end_logits: np.ndarray, feats: list[Feature], examples: list[Example],
           max_answer_length: int) -> dict:
  """{question id: answer text}: the best span over each question's windows, cut from the paragraph."""
  best = {}
  seq_len = start_logits.shape[1]
  for r, f in enumerate(feats):
    valid = np.zeros((seq_len,), bool)
    valid[list(f.char_spans)] = True
    found = best_span(start_logits[r], end_logits[r], valid, max_answer_length)
    if found is None:
      continue
    i, j, score = found
    if f.example not in best or score > best[f.example][0]:
      first, last = f.char_spans[i][0], f.char_spans[j][1]
      best[f.example] = (score, examples[f.example].context[first:last].strip())
  return {examples[n].id: best[n][1] if n in best else "" for n in range(len(examples))}
