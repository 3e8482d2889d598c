"""Question classification, TREC (Li & Roth, 2002): 6 coarse answer types (ABBR, DESC, ENTY, HUM, LOC, NUM).

  python -m mlm_jax.finetune --config=configs/finetune/trec.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_trec            # ...trec.py:fast for the downstream suite's fast budget

Data: ../shared/data/downstream/question_classification_trec: train.txt (5,452 questions) and the
official TREC-10 test.txt (500), one `COARSE:fine question` per line (task.format='trec'; the
coarse label is the class; one invalid UTF-8 byte in train.txt is replaced). The test set is the
eval set: evaluate at the last step only (train.eval_every=0) when reporting it, as the
downstream suite does, since there is no dev split to choose a checkpoint on.
Metric: accuracy (TREC's standard). Expected: majority class 0.19 on the test set; base-sized encoders ~0.97.
Head: RoBERTa's classification head on <s> (BERT's pooler when the model has one), mlm_jax/finetuning/heads.py.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  d = os.path.join(_DATA, "downstream", "question_classification_trec")
  c.task.kind = "classification"
  c.task.format = "trec"
  c.task.train_files = (f"{d}/train.txt",)
  c.task.eval_files = (f"{d}/test.txt",)
  c.task.labels = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
  c.seq_len = 48
  c.optimizer.update(dict(learning_rate=2e-4, warmup_fraction=0.1, weight_decay=0.01))
  c.train.update(dict(steps=400, batch_size=32, eval_batch_size=100, log_every=50, eval_every=0, save_every=100))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.save_every": 0})
