"""Demo: pretrain a tiny RoBERTa-style encoder on CPU in about 2 minutes, from nothing.

  python -m mlm_jax.train --config=configs/demo.py --workdir=/tmp/mlm_demo

Hardware: any laptop or 2-core VM; no network, no accelerator, no ../shared.
Corpus: Python's own documentation (pydoc topics + standard-library docstrings, ~1.6 MB of
English), written to WORKDIR/demo_corpus by the binary; a 4000-piece unigram sentencepiece model
is trained on it first (WORKDIR/tokenizer, a few seconds).
Expected result: held-out MLM loss falls from ~6.5 at the first evaluation (step 50) to ~4 at
step 300 (masked-token accuracy ~0.3); checkpoints in WORKDIR/checkpoints, metrics in
WORKDIR/metrics.jsonl and WORKDIR/tensorboard.
Recipe: RoBERTa (Liu et al., 2019, arXiv:1907.11692) dynamic masking and FULL-SENTENCES-style
packing, shrunk to 4 layers x 128 hidden.
"""
from mlm_jax.defaults import default_config


def get_config():
  c = default_config()
  c.seed = 0
  c.demo_corpus = True
  c.tokenizer.vocab_size = 4000
  c.tokenizer.layout = "xlmr"

  c.data.sources = ("python_docs={workdir}/demo_corpus/*.txt",)
  c.data.eval_percent = 5.0
  c.data.seq_len = 128
  c.data.shuffle_buffer = 1000

  c.model.update(dict(vocab_size=0, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512,
                      max_position_embeddings=130, type_vocab_size=1, position_offset=2,
                      layer_norm_eps=1e-5, hidden_dropout=0.1, attention_dropout=0.1))
  c.optimizer.update(dict(learning_rate=1e-3, warmup_steps=30, schedule="linear", b2=0.98, eps=1e-6,
                          weight_decay=0.01))
  c.train.update(dict(steps=300, batch_size=32, log_every=25, eval_every=50, eval_batches=8,
                      save_every=100))
  return c
