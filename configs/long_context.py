"""Long-context encoder in the ModernBERT style (Warner et al., 2024, "Smarter, Better, Faster, Longer: A Modern
Bidirectional Encoder for Fast, Memory Efficient, and Long Context Finetuning and Inference", arXiv:2412.13663).

  python -m mlm_jax.train --config=configs/long_context.py --workdir=gs://BUCKET/long_context \\
      --config.data.sources="('en=gs://BUCKET/corpus/en/*.txt',)" --config.data.tokenizer=gs://BUCKET/spm50k.model
  # will it fit: python tools/aot_compile.py --config=configs/long_context.py --topology=v5p:2x2x2

Hardware: a TPU v5p-8 (2x2x2) or larger; splash attention is what makes it fit (the xla path
materializes [batch, heads, 8192, 8192] float32 scores per layer; see docs/tpu_fit.md).
Recipe after ModernBERT-base: 22 layers, hidden 768, 12 heads, GeGLU FFN 1152, pre-LN, rotary
positions, a global attention layer every 3 layers (theta 160k) and 128-token sliding windows in
the others (theta 10k), no dropout, 30% masking, sequences of 8192 tokens, global batch 64
(0.5M tokens). Layers are scanned in groups of 3 (7 groups and one unrolled layer).
ModernBERT trains at 1024 tokens first and extends the context to 8192; this config is that
second phase (start it with --config.init_from=a workdir of the same model at seq 1024).
Runtime and MLM accuracy: not measured here (no TPU at hand); the AOT tool shows memory and fit.
"""
from mlm_jax.config.defaults import default_config


def get_config():
  c = default_config()
  c.model.update(dict(vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                      mlp="geglu", norm="pre", positions="rotary", rope_theta=160_000.0,
                      rope_theta_local=10_000.0, global_attention_every=3, local_window=128,
                      max_position_embeddings=8192, type_vocab_size=0, position_offset=0, layer_norm_eps=1e-5,
                      hidden_dropout=0.0, attention_dropout=0.0, dtype="bfloat16", scan_layers=True))
  c.tokenizer.update(dict(layout="xlmr", vocab_size=50368))
  c.masking.mask_rate = 0.3
  c.data.seq_len = 8192
  c.data.packing = "segmented"
  c.optimizer.update(dict(learning_rate=3e-4, warmup_steps=1_000, schedule="linear", b1=0.9, b2=0.98,
                          eps=1e-6, weight_decay=1e-5, clip_norm=1.0))
  c.train.update(dict(steps=100_000, batch_size=64, log_every=50, eval_every=2_000, save_every=1_000))
  c.mesh.update(dict(data=-1, fsdp=1, tensor=1))
  return c
