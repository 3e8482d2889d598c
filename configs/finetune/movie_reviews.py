"""Document sentiment (binary), Pang & Lee's movie review polarity v2.0: 2,000 long reviews, JSON lines.

  python -m mlm_jax.finetune --config=configs/finetune/movie_reviews.py --init_from=/tmp/mlm_demo \
      --workdir=/tmp/ft_movies          # ...movie_reviews.py:fast for the downstream suite's fast budget

Data: ../shared/data/downstream/sentiment_movie_reviews/movie_reviews.jsonl.gz (`{"label", "file",
"text"}`, 1,000 pos and 1,000 neg, lower-cased and tokenized, ~700 words each; no official split: 10%
held out by a stable hash of the text). Reviews are cut to their first seq_len pieces (256 here,
128 in the fast budget), so this tests how much sentiment a model reads from a review's opening.
Metric: accuracy (balanced classes). Hardware: CPU, minutes for a demo-sized model.
Expected: ~0.5 is chance; base-sized encoders reach ~0.9 with the whole review (512 tokens).
Head: RoBERTa's classification head on <s> (BERT's pooler when the model has one), mlm_jax/finetuning/heads.py.
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  c.task.kind = "classification"
  c.task.format = "jsonl"
  c.task.train_files = (os.path.join(_DATA, "downstream", "sentiment_movie_reviews", "movie_reviews.jsonl.gz"),)
  c.task.text_field = "text"
  c.task.label_field = "label"
  c.task.labels = ("neg", "pos")
  c.task.eval_percent = 10.0
  c.seq_len = 256
  c.optimizer.update(dict(learning_rate=2e-4, warmup_fraction=0.1, weight_decay=0.01))
  c.train.update(dict(steps=400, batch_size=16, eval_batch_size=64, log_every=50, eval_every=100, save_every=100))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.eval_every": 0,
                               "train.save_every": 0, "seq_len": 128})
