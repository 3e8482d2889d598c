"""Named-entity recognition (PER / LOC / ORG, IOB2), Universal NER v1 English-EWT: token classification.

  python -m mlm_jax.finetune --config=configs/finetune/ner.py --init_from=/tmp/mlm_demo --workdir=/tmp/ft_ner

Data: ../shared/data/downstream/ner_uner, trained on en_ewt dev (2,001 sentences; the EWT train file
is not in the shared data) and evaluated on en_ewt test (2,077). Columns: token 1, tag 2. Your own
CoNLL file (token first, tag last, blank line between sentences, e.g. CoNLL-2003 or WNUT-17):
`--config.task.train_files="('train.conll',)" --config.task.eval_files="('dev.conll',)"
--config.task.token_column=0 --config.task.tag_column=-1`.
Metric: entity-level F1 exactly as conlleval computes it (`eval_f1`, also precision/recall and
token accuracy); predictions in WORKDIR/predictions.conll (word, gold, predicted: conlleval's input).
Hardware: CPU for the demo model, minutes. Expected: entity F1 far below published numbers from a
demo-sized model trained on 2,001 sentences (not measured to convergence here); base-sized
multilingual encoders score in the 0.8-0.9 range on UNER English (Mayhew et al., 2024).
Head: a linear layer on every position; labels on the first sub-token of each word (BERT's recipe).
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  d = os.path.join(_DATA, "downstream", "ner_uner")
  c.task.kind = "token"
  c.task.train_files = (f"{d}/en_ewt-ud-dev.iob2.gz",)
  c.task.eval_files = (f"{d}/en_ewt-ud-test.iob2.gz",)
  c.task.token_column = 1
  c.task.tag_column = 2
  c.task.labels = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
  c.seq_len = 128
  c.optimizer.update(dict(learning_rate=3e-4, warmup_fraction=0.1))
  c.train.update(dict(steps=600, batch_size=32, eval_batch_size=128, log_every=50, eval_every=200,
                      save_every=200))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.eval_every": 0,
                               "train.save_every": 0, "seq_len": 64, "task.max_eval_examples": 200})
