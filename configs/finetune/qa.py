"""Extractive question answering, SQuAD v1.1 format: XQuAD English (SQuAD v1.1 dev paragraphs).

  python -m mlm_jax.finetune --config=configs/finetune/qa.py --init_from=/tmp/mlm_demo --workdir=/tmp/ft_qa

Data: ../shared/data/downstream/qa_xquad/xquad.en.json.gz, 1,190 questions on 48 articles; 20% of
the articles are held out by a stable hash of their title (XQuAD has no training split: this is a
smoke-sized task, not a benchmark). Your own data: SQuAD v1.1 JSON files,
`--config.task.train_files="('train-v1.1.json',)" --config.task.eval_files="('dev-v1.1.json',)"`.
Paragraphs longer than seq_len are read in windows `task.doc_stride` pieces apart; answers are
at most `task.max_answer_length` pieces and are cut from the original paragraph text.
Metric: SQuAD v1.1 exact match and F1 (`eval_exact_match`, `eval_f1`, fractions; the official
script prints percentages); predictions in WORKDIR/predictions.json ({question id: answer}, the
official script's input).
Hardware: CPU for the demo model, minutes; expect low scores from a tiny model on 1k questions
(BERT-base fine-tuned on SQuAD's 88k questions reaches EM 81 / F1 88, Devlin et al., 2019).
"""
import os

from mlm_jax.config.finetune_defaults import budget, finetune_config

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def get_config(mode="full"):
  c = finetune_config()
  c.task.kind = "qa"
  c.task.train_files = (os.path.join(_DATA, "downstream", "qa_xquad", "xquad.en.json.gz"),)
  c.task.eval_percent = 20.0
  c.task.max_query_length = 32
  c.task.doc_stride = 64
  c.task.max_answer_length = 30
  c.seq_len = 128
  c.optimizer.update(dict(learning_rate=3e-4, warmup_fraction=0.1))
  c.train.update(dict(steps=600, batch_size=32, eval_batch_size=128, log_every=50, eval_every=200,
                      save_every=200))
  return budget(c, mode, fast={"train.steps": 100, "train.batch_size": 16, "train.eval_every": 0,
                               "train.save_every": 0, "task.max_eval_examples": 100})
