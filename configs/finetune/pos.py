"""Part-of-speech tagging (17 Universal POS tags), Parallel Universal Dependencies (PUD), CoNLL-U.

  python -m mlm_jax.finetune --config=configs/finetune/pos.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_pos             # ...pos.py:fast for the downstream suite's fast budget

Data: ../shared/data/downstream/pos_ud_pud/en_pud-ud-test.conllu.gz: 1,000 English sentences, the
same sentences (by `sent_id`) in 8 languages. PUD is test-only, so 20% of the sentences are held
out by a stable hash of their sent_id (never of their text): the downstream suite's cross-lingual
columns score the same held-out sent_ids in every other language, so no translation of a
training sentence is ever scored. Multiword-token lines (`3-4`) and empty nodes (`3.1`) are
skipped (task.format='conllu'); the tag is UPOS (column 3).
Metric: token accuracy (UPOS accuracy, `eval_token_accuracy`). Expected: the majority tag (NOUN)
gives ~0.2; base-sized multilingual encoders reach ~0.95 in English and ~0.75-0.9 zero-shot.
Head: a linear layer on every position; labels on the first sub-token of each word.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X")


def get_config(mode="full"):
  c = finetune_config()
  c.task.kind = "token"
  c.task.format = "conllu"
  c.task.train_files = (os.path.join(_DATA, "downstream", "pos_ud_pud", "en_pud-ud-test.conllu.gz"),)
  c.task.eval_percent = 20.0
  c.task.token_column = 1
  c.task.tag_column = 3
  c.task.labels = UPOS
  c.seq_len = 128
  c.optimizer.update(dict(learning_rate=3e-4, warmup_fraction=0.1))
  c.train.update(dict(steps=600, batch_size=32, eval_batch_size=128, log_every=50, eval_every=0,
                      save_every=200, best_metric="token_accuracy"))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.save_every": 0,
                               "seq_len": 96})
