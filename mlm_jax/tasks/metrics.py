"""Downstream metrics, computed on the host from decoded predictions, exactly as the reference scripts do.

Accuracy and macro-F1 (scikit-learn's), entity F1 with conlleval's chunk rules, SQuAD v1.1's exact
match and F1; all rates are fractions in [0, 1]. The rules: docs/design_notes.md#metrics.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence


# ------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------
def accuracy(gold: Sequence, pred: Sequence) -> float:
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
  return sum(g == p for g, p in zip(gold, pred)) / max(len(gold), 1)


def macro_f1(gold: Sequence, pred: Sequence) -> float:
  """Mean per-class F1 over every class seen in gold or predictions (a class never right scores 0)."""
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
  classes = sorted(set(gold) | set(pred), key=str)
  if not classes:
    return 0.0
  scores = []
  for c in classes:
    tp = sum(g == c and p == c for g, p in zip(gold, pred))
    fp = sum(g != c and p == c for g, p in zip(gold, pred))
    fn = sum(g == c and p != c for g, p in zip(gold, pred))
    scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
  return sum(scores) / len(scores)


# ------------------------------------------------------------------------------------------
# NER (conlleval)
# ------------------------------------------------------------------------------------------
def _split_tag(tag: str) -> tuple[str, str]:
  """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''); a bare type 'PER' is read as ('I', 'PER') like IOB1 data."""
  if tag == "O" or not tag:
    return "O", ""
  if "-" in tag:
    prefix, kind = tag.split("-", 1)
    return prefix, kind
  return "I", tag


def _chunk_ends(prev_tag, tag, prev_type, kind) -> bool:
  """conlleval's endOfChunk: does the chunk holding the previous token end before this one?"""
  if prev_tag in ("E", "S"):
    return True
  if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
    return True
  return prev_tag != "O" and prev_type != kind


def _chunk_starts(prev_tag, tag, prev_type, kind) -> bool:
  """conlleval's startOfChunk: does a chunk begin at this token?"""
  if tag in ("B", "S"):
    return True
  if tag in ("I", "E") and prev_tag in ("E", "S", "O"):
    return True
  return tag != "O" and prev_type != kind


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """Entity chunks of one sentence as (type, first, last) token indices, by conlleval's rules."""
  out, start = [], None
  prev_tag, prev_type = "O", ""
  for i, raw in enumerate(list(tags) + ["O"]):   # a sentence boundary acts as an O
    tag, kind = _split_tag(raw)
    if start is not None and _chunk_ends(prev_tag, tag, prev_type, kind):
      out.append((prev_type, start, i - 1))
      start = None
    if _chunk_starts(prev_tag, tag, prev_type, kind):
      start = i
    prev_tag, prev_type = tag, kind
  return out


_CHUNK_TAG = re.compile(r"[BIES]-.+")


def is_chunk_tagset(labels: Iterable[str]) -> bool:
  """Whether tags are chunk tags conlleval can read (O, B-/I-/E-/S-TYPE: IOB1, IOB2/BIO, IOBES); UPOS
  tags (NOUN, VERB) are not: read as IOB1 they would give a meaningless chunk F1."""
  labels = list(labels)
  return bool(labels) and all(t == "O" or _CHUNK_TAG.fullmatch(t) for t in labels)


def token_accuracy(gold_sentences: Iterable[Sequence[str]], pred_sentences: Iterable[Sequence[str]]) -> float:
  """The share of tokens whose predicted tag is the gold one, over all sentences."""
  tokens = right = 0
  for gold, pred in zip(gold_sentences, pred_sentences):
    if len(gold) != len(pred):
      raise ValueError(f"sentence has {len(gold)} gold tags but {len(pred)} predicted tags")
    tokens += len(gold)
    right += sum(a == b for a, b in zip(gold, pred))
  return right / tokens if tokens else 0.0


def conlleval(gold_sentences: Iterable[Sequence[str]], pred_sentences: Iterable[Sequence[str]]) -> dict:
  """Entity-level {precision, recall, f1, accuracy, per_type: {T: {precision, recall, f1, support}}}.

  Sentences are scored separately (a chunk never crosses a sentence boundary) and counts summed, as
  conlleval does over a file with blank lines between sentences. `accuracy` is token accuracy.
  """
  found_gold, found_pred, correct = collections.Counter(), collections.Counter(), collections.Counter()
  tokens = right = 0
  for gold, pred in zip(gold_sentences, pred_sentences):
    if len(gold) != len(pred):
      raise ValueError(f"sentence has {len(gold)} gold tags but {len(pred)} predicted tags")
    g, p = set(chunks(gold)), set(chunks(pred))
    found_gold.update(t for t, _, _ in g)
    found_pred.update(t for t, _, _ in p)
    correct.update(t for t, _, _ in g & p)
    tokens += len(gold)
    right += sum(a == b for a, b in zip(gold, pred))

  def prf(c, fp, fg):
    precision = c / fp if fp else 0.0
    recall = c / fg if fg else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return dict(precision=precision, recall=recall, f1=f1)

  total = prf(sum(correct.values()), sum(found_pred.values()), sum(found_gold.values()))
  per_type = {t: dict(prf(correct[t], found_pred[t], found_gold[t]), support=found_gold[t])
              for t in sorted(set(found_gold) | set(found_pred))}
  return dict(total, accuracy=right / tokens if tokens else 0.0, per_type=per_type)


# ------------------------------------------------------------------------------------------
# Extractive QA (SQuAD v1.1)
# ------------------------------------------------------------------------------------------
_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
  """SQuAD v1.1: lower case, drop ASCII punctuation, then the articles, then collapse whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
  """Bag-of-tokens F1 between the normalized answers (0 when nothing is shared, also for two empties)."""
  p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(p), common / len(g)
  return 2 * precision * recall / (precision + recall)


def squad(gold_answers: dict, predictions: dict) -> dict:
  """{exact_match, f1} over questions: `gold_answers` id -> [answer texts], `predictions` id -> text.

  A question without a prediction scores 0 (the official script does the same and warns).
  """
  if not gold_answers:
    return dict(exact_match=0.0, f1=0.0)
  em = f1 = 0.0
  for qid, answers in gold_answers.items():
    pred = predictions.get(qid)
    if pred is None:
      continue
    em += max(exact_match(pred, a) for a in answers)
    f1 += max(token_f1(pred, a) for a in answers)
  return dict(exact_match=em / len(gold_answers), f1=f1 / len(gold_answers))
