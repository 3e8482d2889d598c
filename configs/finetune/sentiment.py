"""Sentence sentiment (binary), Pang & Lee's sentence polarity v1.0: one text file per class.

  python -m mlm_jax.finetune --config=configs/finetune/sentiment.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_sentiment

Data: ../shared/data/downstream/sentiment_sentence_polarity (rt-polarity.pos/.neg, 5,331 snippets each,
no official split: 10% held out by a stable hash of the text). Your own data: a file per class with
one example per line, `--config.task.train_files="('pos=my/pos.txt','neg=my/neg.txt')"`, or a
TSV/CSV/JSONL file with `--config.task.format=tsv --config.task.text_field=1 --config.task.label_field=0`.
Hardware: CPU is enough for a demo-sized model: 300 steps of 32 x 64 tokens, a few minutes.
Expected: a hard task for tiny models. Measured with a 4-layer, 128-wide model pretrained 400 steps on
English news sentences: held-out accuracy 0.65 (random initialization, `--config.random_init=True`:
0.67; this budget does not separate them, see configs/finetune/sms_spam.py for a task that does).
Base-sized pretrained encoders reach ~0.9 on this dataset; use their recipe (AdamW lr 1e-5..3e-5,
6% warmup, a few epochs).
Head: RoBERTa's classification head on <s> (BERT's pooler when the model has one), mlm_jax/finetuning/heads.py.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  d = os.path.join(_DATA, "downstream", "sentiment_sentence_polarity")
  c.task.kind = "classification"
  c.task.format = "lines"
  c.task.train_files = (f"pos={d}/rt-polarity.pos.gz", f"neg={d}/rt-polarity.neg.gz")
  c.task.eval_percent = 10.0
  c.task.labels = ("neg", "pos")
  c.seq_len = 64
  c.optimizer.update(dict(learning_rate=2e-4, warmup_fraction=0.1, weight_decay=0.01))
  c.train.update(dict(steps=300, batch_size=32, eval_batch_size=128, log_every=25, eval_every=100,
                      save_every=100))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.eval_every": 0,
                               "train.save_every": 0, "task.max_eval_examples": 300})
