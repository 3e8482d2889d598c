"""Demo: pretrain a tiny RoBERTa-style encoder on CPU in a few minutes, from nothing.

  python -m mlm_jax.train --config=configs/demo.py --workdir=/tmp/mlm_demo

Hardware: any laptop or 2-core VM; no network, no accelerator, no ../shared.
Corpus: Python's own documentation (pydoc topics + standard-library docstrings, ~1.6 MB of
English), written to WORKDIR/demo_corpus by the binary; a 4000-piece unigram sentencepiece model
is trained on it first (WORKDIR/tokenizer, ~20 s).
Expected result: the held-out MLM loss starts at 8.3 (= ln 4000, the untrained model, evaluated
before step 1) and ends near 5.7 at step 800 (-31%; masked-token accuracy ~0.14): first the unigram
distribution is learned (~6.5 by step 100), then context. Checkpoints in WORKDIR/checkpoints,
metrics in WORKDIR/metrics.jsonl and WORKDIR/tensorboard.
Recipe: RoBERTa (Liu et al., 2019, arXiv:1907.11692) dynamic masking, shrunk to 2 layers x 128
hidden on 64-token sequences, without dropout (a short run on little data).

`:phases` (docs/phases.md): the same size in ModernBERT's layout (rotary, pre-LN, GeGLU; to_hf writes
ModernBertForMaskedLM) as one run in three phases: 400 steps at 32 tokens, 300 at 64 with RoPE theta
40k, then a 100-step linear decay on the language reference part of the corpus alone
(WORKDIR/demo_corpus/topics). Same hardware and runtime as above.
"""
from mlm_jax.config.defaults import default_config


def get_config(variant=""):
  if variant not in ("", "phases"):
    raise ValueError(f"configs/demo.py:{variant}: expected no variant or 'phases'")
  c = default_config()
  c.seed = 0
  c.demo_corpus = True
  c.tokenizer.vocab_size = 4000
  c.tokenizer.layout = "xlmr"

  c.data.sources = ("python_docs={workdir}/demo_corpus/*.txt",)
  c.data.eval_percent = 5.0
  c.data.seq_len = 64
  c.data.shuffle_buffer = 1000

  c.model.update(dict(vocab_size=0, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512,
                      max_position_embeddings=66, type_vocab_size=1, position_offset=2,
                      layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0))
  c.optimizer.update(dict(learning_rate=1.5e-3, warmup_steps=50, schedule="linear", b2=0.98, eps=1e-6,
                          weight_decay=0.01))
  c.train.update(dict(steps=800, batch_size=32, log_every=50, eval_every=100, eval_batches=8,
                      eval_at_start=True, save_every=200))
  if variant == "phases":
    _phases(c)
  return c


def _phases(c):
  """pretrain on 32-token rows, extend to 64 with a higher RoPE theta, decay on the language reference."""
  # ModernBERT's layout (rotary positions, which any sequence length can use; to_hf writes ModernBertForMaskedLM)
  c.model.update(dict(positions="rotary", max_position_embeddings=64, position_offset=0, type_vocab_size=0,
                      norm="pre", mlp="geglu", embedding_norm=True, first_layer_attention_norm=False,
                      attention_bias=False, mlp_bias=False, norm_bias=False, head_bias=False))
  c.data.seq_len = 32
  c.optimizer.update(dict(schedule="constant", warmup_steps=50))
  c.train.update(dict(eval_every=200, save_every=100))
  c.phases = (
      {"name": "pretrain", "end_step": 400},
      {"name": "extend", "end_step": 700, "data.seq_len": 64, "model.rope_theta": 40_000.0},
      {"name": "decay", "end_step": 800, "data.sources": ("topics={workdir}/demo_corpus/topics/*.txt",),
       "optimizer.schedule": "linear", "optimizer.warmup_steps": 0},
  )
