"""SMS spam detection (ham / spam): single-sentence classification from a TSV file.

  python -m mlm_jax.finetune --config=configs/finetune/sms_spam.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_spam

Data: ../shared/data/downstream/sms_spam/SMSSpamCollection.tsv (`label<TAB>message`, 4,827 ham and 747
spam, no header, no official split: 10% held out by a stable hash of the message). Your own TSV:
`--config.task.train_files="('train.tsv',)" --config.task.eval_files="('dev.tsv',)"
--config.task.text_field=1 --config.task.label_field=0` (column numbers, or names with
`--config.task.header=True`; CSV and JSON lines with `--config.task.format=csv|jsonl`).
Hardware: CPU, 150 steps of 32 x 48 tokens for a demo-sized model: about a minute on 2 cores.
Expected: held-out accuracy ~0.98 from a demo-sized model pretrained a few minutes on English news
text, against ~0.96 from random initialization with the same budget (`--config.random_init=True`;
tests/test_finetune_pretrained.py checks that pretraining wins); 87% of the messages are ham.
Head: RoBERTa's classification head on <s> (BERT's pooler when the model has one), mlm_jax/finetuning/heads.py.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  c.task.kind = "classification"
  c.task.format = "tsv"
  c.task.train_files = (os.path.join(_DATA, "downstream", "sms_spam", "SMSSpamCollection.tsv"),)
  c.task.text_field = "1"
  c.task.label_field = "0"
  c.task.labels = ("ham", "spam")
  c.task.eval_percent = 10.0
  c.seq_len = 48
  c.optimizer.update(dict(learning_rate=5e-4, warmup_fraction=0.1, weight_decay=0.01))
  c.train.update(dict(steps=150, batch_size=32, eval_batch_size=100, log_every=25, eval_every=50, save_every=50))
  return budget(c, mode, fast={"train.steps": 60, "train.batch_size": 16, "train.eval_every": 0,
                               "train.save_every": 0, "task.max_eval_examples": 300})
