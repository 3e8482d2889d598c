"""Linear probes (mlm_jax/evaluation/probe.py): the classifier, the collapse measure, and a real task's sample
scored through the fine-tuning task's own metric."""
import importlib.util

import numpy as np
import pytest

from mlm_jax.evaluation import probe
from subproc import REPO


def test_ridge_classifier_separates_what_is_linearly_separable():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 3, 600)
  x = rng.normal(size=(600, 8)) + 4.0 * np.eye(8)[y]   # class c shifts feature c
  model = probe.fit_ridge(x[:400], y[:400], 3)
  assert (probe.predict_ridge(model, x[400:]).argmax(-1) == y[400:]).mean() > 0.97
  noise = probe.fit_ridge(rng.normal(size=(400, 8)), y[:400], 3)
  assert (probe.predict_ridge(noise, x[400:]).argmax(-1) == y[400:]).mean() < 0.5


def test_token_cosine_is_1_for_collapsed_vectors_and_0_for_orthogonal_ones():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  same = np.tile(np.array([3.0, 4.0, 0.0, 0.0]), (2, 4, 1))
  same[:, 3] = [0.0, 0.0, 0.0, 9.0]   # padding does not count
  assert probe.token_cosine(same, mask) == pytest.approx(1.0)
  orth = np.tile(np.eye(4)[None], (2, 1, 1)) * 5.0
  assert probe.token_cosine(orth, mask) == pytest.approx(0.0)
  assert probe.pooled(same, mask)[0] == pytest.approx([3.0, 4.0, 0.0, 0.0])


def _task_config(name):
  spec = importlib.util.spec_from_file_location(name, REPO / "configs" / "finetune" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config().task


def test_a_probe_scores_features_against_the_task_s_own_labels(shared_data, corpus_and_tokenizer):
  """On sms_spam's real sample: features that carry the label score 1, constant features only what
  predicting one class gives (macro-F1 at most 0.5); on UNER's token task, entity F1 near 1 and 0."""
  from mlm_jax.data.tokenizers import load as tokenizer_load
  tok = tokenizer_load.load(corpus_and_tokenizer[1])
  spam = probe.from_task_config("sms_spam", _task_config("sms_spam"), tok, 48, 1, max_train=200, max_eval=100)
  assert spam.kind == "classification" and len(spam.eval["label"]) == 100
  by_row = {}

  def leaking(batch):   # a row's label as its feature, looked up by the row's ids
    for split in (spam.train, spam.eval):
      for ids, label in zip(split["input_ids"], split["label"]):
        by_row[ids.tobytes()] = label
    labels = np.array([by_row.get(ids.tobytes(), 0) for ids in batch["input_ids"]])
    return np.repeat(np.eye(2)[labels][:, None, :], batch["input_ids"].shape[1], axis=1)

  assert probe.run_task(spam, leaking, 64)[0] == pytest.approx(1.0)
  constant = lambda batch: np.ones(batch["input_ids"].shape + (4,), np.float32)
  assert probe.run_task(spam, constant, 64)[0] <= 0.5

  ner = probe.from_task_config("ner", _task_config("ner"), tok, 128, 1, max_train=100, max_eval=50)

  def tags(batch):   # each labeled piece's tag one-hot, from the arrays' own labels (eval included)
    out = np.zeros(batch["input_ids"].shape + (ner.num_labels,), np.float32)
    for split in (ner.train, ner.eval):
      for ids, labels in zip(split["input_ids"], split["labels"]):
        rows = np.nonzero((batch["input_ids"] == ids).all(1))[0]
        for r in rows:
          out[r][labels >= 0] = np.eye(ner.num_labels)[labels[labels >= 0]]
    return out

  assert probe.run_task(ner, tags, 32)[0] > 0.95   # not 1: words past 128 pieces are cut, scored as O
  assert probe.run_task(ner, constant, 32)[0] == 0.0   # every word O: no entity found
  result = probe.Probes([spam], 64)(constant)
  assert set(result) == {"probe/sms_spam", "probe/token_cosine", "probe/seconds"}
  assert result["probe/token_cosine"] == pytest.approx(1.0)
