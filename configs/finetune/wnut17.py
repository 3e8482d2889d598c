"""Emerging-entity NER, WNUT-2017 (Derczynski et al., 2017): 6 entity types in noisy user text, IOB2.

  python -m mlm_jax.finetune --config=configs/finetune/wnut17.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_wnut            # ...wnut17.py:fast for the downstream suite's fast budget

Data: ../shared/data/downstream/ner_wnut17: train 3,394 sentences, dev 1,009 (the eval set here: it
picks the best checkpoint), test 1,287 (emerging.test.annotated; the downstream suite reports it,
scored with the dev-selected checkpoint). `token<TAB>tag` lines; a line holding only a tab
separates sentences in the train file.
Metric: entity-level F1 as conlleval computes it. Expected: a hard task: published base-sized
encoders reach ~0.5-0.6 test F1; a demo-sized model scores near 0.
Head: a linear layer on every position; labels on the first sub-token of each word.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
LABELS = ("O",) + tuple(f"{p}-{t}" for t in ("person", "location", "group", "creative-work", "corporation", "product")
                        for p in "BI")


def get_config(mode="full"):
  c = finetune_config()
  d = os.path.join(_DATA, "downstream", "ner_wnut17")
  c.task.kind = "token"
  c.task.train_files = (f"{d}/wnut17train.conll.gz",)
  c.task.eval_files = (f"{d}/emerging.dev.conll.gz",)
  c.task.token_column = 0
  c.task.tag_column = 1
  c.task.labels = LABELS
  c.seq_len = 64
  c.optimizer.update(dict(learning_rate=3e-4, warmup_fraction=0.1))
  c.train.update(dict(steps=600, batch_size=32, eval_batch_size=128, log_every=50, eval_every=200,
                      save_every=200))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.eval_every": 50,
                               "train.save_every": 0, "task.max_eval_examples": 300})
