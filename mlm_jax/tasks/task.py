"""One fine-tuning task, ready for the loop: encoded train/eval arrays, metrics and a predictions file.

`build(task_cfg, tok, seq_len, type_vocab_size)` reads `config.task`'s files (splitting off a held-out
set when none is given) and returns a `Task`: `score(outputs)` -> metrics, `write_predictions(outputs,
path)` -> a file per task type (docs/design_notes.md#task).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import ml_collections

from mlm_jax.tasks import metrics as task_metrics
from mlm_jax.data.tokenizers.base import Tokenizer
from mlm_jax.tasks import features, qa, readers

# by kind; a token task whose tags are not chunk tags (POS) is scored by token_accuracy (Task.default_metric)
DEFAULT_METRIC = dict(classification="accuracy", regression="pearson", token="f1", qa="f1")
PREDICTIONS_FILE = dict(classification="predictions.jsonl", regression="predictions.jsonl",
                        token="predictions.conll", qa="predictions.json")


@dataclasses.dataclass
class Task:
  kind: str
  labels: list                 # label names in id order ([] for regression and QA)
  train: dict                  # encoded arrays
  eval: dict
  eval_examples: list
  eval_meta: Any               # token: first-piece positions per sentence; qa: Features
  max_answer_length: int = 30

  @property
  def num_labels(self) -> int:
    return max(len(self.labels), 1)

  @property
  def chunk_tags(self) -> bool:
    """A token task whose tags are entity chunks (IOB/BIO): scored by conlleval; other tags (UPOS) by token accuracy."""
    return self.kind == "token" and task_metrics.is_chunk_tagset(self.labels)

  @property
  def default_metric(self) -> str:
    return "token_accuracy" if self.kind == "token" and not self.chunk_tags else DEFAULT_METRIC[self.kind]

  def decode(self, outputs) -> list | dict:
    """Predictions per eval example: label names, target values, tag lists or {id: answer}."""
    if self.kind == "classification":
      return [self.labels[int(i)] for i in np.asarray(outputs).argmax(-1)]
    if self.kind == "regression":
      return [float(x) for x in np.asarray(outputs)[:, 0]]
    if self.kind == "token":
      return features.decode_tokens(np.asarray(outputs), self.eval_meta, self.eval_examples, self.labels)
    start, end = outputs
    return qa.decode(np.asarray(start), np.asarray(end), self.eval_meta, self.eval_examples, self.max_answer_length)

  def score(self, outputs) -> tuple[dict, Any]:
    pred = self.decode(outputs)
    ex = self.eval_examples
    if self.kind == "classification":
      gold = [str(e.label) for e in ex]
      return dict(accuracy=task_metrics.accuracy(gold, pred), macro_f1=task_metrics.macro_f1(gold, pred)), pred
    if self.kind == "regression":
      gold = np.asarray([float(e.label) for e in ex])
      p = np.asarray(pred)
      pearson = float(np.corrcoef(gold, p)[0, 1]) if len(gold) > 1 and p.std() > 0 and gold.std() > 0 else 0.0
      return dict(mse=float(np.mean((gold - p) ** 2)), pearson=pearson), pred
    if self.kind == "token" and not self.chunk_tags:
      return dict(token_accuracy=task_metrics.token_accuracy([e.tags for e in ex], pred)), pred
    if self.kind == "token":
      r = task_metrics.conlleval([e.tags for e in ex], pred)
      return dict(f1=r["f1"], precision=r["precision"], recall=r["recall"], token_accuracy=r["accuracy"]), pred
    gold = {e.id: [a["text"] for a in e.answers] for e in ex if e.answers}
    return task_metrics.squad(gold, pred), pred

  def write_predictions(self, pred, path: str) -> None:
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "w") as f:
      if self.kind == "qa":
        json.dump(pred, f, ensure_ascii=False, indent=1, sort_keys=True)
      elif self.kind == "token":
        for e, tags in zip(self.eval_examples, pred):
          for w, g, p in zip(e.words, e.tags, tags):
            f.write(f"{w} {g} {p}\n")
          f.write("\n")
      else:
        for e, p in zip(self.eval_examples, pred):
          row = dict(id=e.id, text=e.text, label=e.label, prediction=p)
          if e.text_b is not None:
            row["text_b"] = e.text_b
          f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read(t: ml_collections.ConfigDict, files) -> list:
  if t.kind == "classification" and t.format == "trec":
    return readers.read_trec(list(files))
  if t.kind == "token" and t.format == "conllu":
    return readers.read_conllu(list(files), t.tag_column, t.token_column)
  if t.kind in ("classification", "regression"):
    return readers.read_table(list(files), t.format, t.text_field, t.label_field, t.text_b_field, t.header,
                              regression=t.kind == "regression")
  if t.kind == "token":
    return readers.read_conll(list(files), t.token_column, t.tag_column)
  if t.kind == "qa":
    return readers.read_squad(list(files))
  raise readers.DataError(f"task.kind={t.kind!r}: expected classification, regression, token or qa")


def _encode(t, examples, tok, seq_len, type_vocab_size, labels):
  if t.kind == "classification":
    return features.encode_classification(examples, tok, seq_len, labels, type_vocab_size), None
  if t.kind == "regression":
    return features.encode_classification(examples, tok, seq_len, None, type_vocab_size), None
  if t.kind == "token":
    return features.encode_tokens(examples, tok, seq_len, labels)
  return qa.encode(examples, tok, seq_len, type_vocab_size, t.max_query_length, t.doc_stride)


def _sample(examples: list, n: int) -> list:
  """A fixed random subset of n examples in file order (files are often sorted by label)."""
  if not n or len(examples) <= n:
    return examples
  keep = np.sort(np.random.default_rng(0).choice(len(examples), n, replace=False))
  return [examples[i] for i in keep]


def split(t: ml_collections.ConfigDict) -> tuple[list, list]:
  """(training, eval) examples: the eval files, or the held-out part of the training files by group."""
  if not t.train_files:
    raise readers.DataError("task.train_files is empty: name the labeled training files")
  train = _read(t, t.train_files)
  if t.eval_files:
    evals = _read(t, t.eval_files)
  else:
    evals = [e for e in train if readers.held_out(e.group, t.eval_percent)]
    train = [e for e in train if not readers.held_out(e.group, t.eval_percent)]
  return _sample(train, t.max_train_examples), _sample(evals, t.max_eval_examples)


def build(t: ml_collections.ConfigDict, tok: Tokenizer, seq_len: int, type_vocab_size: int) -> Task:
  train, evals = split(t)
  if not train or not evals:
    raise readers.DataError(f"task: {len(train)} training and {len(evals)} eval examples; both must be non-empty "
                            "(check task.train_files / task.eval_files / task.eval_percent)")
  if t.kind == "token":
    labels = list(t.labels) or sorted({tag for e in train for tag in e.tags} | {"O"})
    unseen = sorted({tag for e in evals for tag in e.tags} - set(labels))
    if unseen:
      raise readers.DataError(f"eval tags {unseen} never occur in the training data: list all tags in task.labels")
  elif t.kind == "classification":
    labels = features.label_vocabulary(train, t.labels)
  else:
    labels = []
  train_arrays, _ = _encode(t, train, tok, seq_len, type_vocab_size, labels)
  eval_arrays, meta = _encode(t, evals, tok, seq_len, type_vocab_size, labels)
  return Task(kind=t.kind, labels=labels, train=train_arrays, eval=eval_arrays, eval_examples=evals,
              eval_meta=meta, max_answer_length=int(t.max_answer_length))


def eval_examples(t: ml_collections.ConfigDict, files) -> list:
  """The examples of more eval files, split as the task's own eval set (see build_eval)."""
  evals = _read(t, files)
  if not t.eval_files:
    evals = [e for e in evals if readers.held_out(e.group, t.eval_percent)]
  return _sample(evals, t.max_eval_examples)


def build_eval(t: ml_collections.ConfigDict, files, tok: Tokenizer, seq_len: int, type_vocab_size: int,
               labels: list) -> Task:
  """One more eval set for a task (its test split, another language), split as the task's own eval set.

  With no `task.eval_files` the task held out part of its training files by group, so only that
  part of `files` is kept: parallel data (PUD, XQuAD) groups the translations of a sentence or an
  article together, and none of them can score a model that trained on the original.
  """
  evals = eval_examples(t, files)
  if not evals:
    raise readers.DataError(f"{', '.join(files)}: no eval examples (after the held-out split)")
  arrays, meta = _encode(t, evals, tok, seq_len, type_vocab_size, labels)
  return Task(kind=t.kind, labels=labels, train={}, eval=arrays, eval_examples=evals, eval_meta=meta,
              max_answer_length=int(t.max_answer_length))
