"""ModernBERT-base (Warner et al., 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder for
Fast, Memory Efficient, and Long Context Finetuning and Inference", arXiv:2412.13663), in its two phases:
`phase=pretrain` (default; sequences of 1024) and `phase=extend` (the context extension to 8192).

  python tools/train_tokenizer.py --input='/data/corpus/en/*.txt' --vocab_size=50368 --model_type=bpe --out=spm_bpe50k
  # once per phase: a token store (every host of a slice: launch/tpu_vm.sh --tool=...)
  python tools/prepare_data.py --sources='en=/data/corpus/en/*.txt' --tokenizer=spm_bpe50k.model \
      --out=/data/store/modernbert --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert_1k
  python -m mlm_jax.train --config=configs/modernbert_base.py:extend --workdir=gs://BUCKET/modernbert_8k \
      --config.init_from=gs://BUCKET/modernbert_1k
  python tools/convert_checkpoint.py to_hf --workdir=gs://BUCKET/modernbert_8k --out=modernbert_hf   # ModernBertForMaskedLM
  # will it fit: python tools/aot_compile.py --config=configs/modernbert_base.py:extend --topology=v5p:2x2x2

Hardware: meant for a TPU v5p-64 or 32+ H100-class GPUs (4.7M-token batches; bf16 compute, fp32
params, fsdp over the slice; fewer chips with optimizer.grad_accum_steps). The 8192-token phase
needs splash attention on TPU (the xla path materializes [batch, heads, 8192, 8192] scores per layer).

Architecture (exactly transformers' ModernBertForMaskedLM; to_hf / from_hf convert it): 22 layers,
hidden 768, 12 heads, GeGLU FFN 1152, pre-LN with a LayerNorm on the embeddings and one after the
last layer, no attention norm in layer 0, no biases except the decoder's, LayerNorm eps 1e-5, rotary
positions, a global attention layer every 3 layers and 128-token sliding windows (|i - j| <= 64) in
the others, local theta 10k, no token types, vocabulary 50368. Layers are scanned in groups of 3
after layer 0 (7 groups), which is unrolled because it has no attention norm.

Recipe: 30% masking (80-10-10), packed documents that do not attend to each other, StableAdamW with
betas (0.9, 0.98), eps 1e-6, decoupled weight decay 1e-5, no gradient clipping. Here StableAdamW is
its nearest optax equivalent (mlm_jax/training/optim.py, optimizer.update_clip_rms=1.0), not the same rule.
The learning rate is trapezoidal, i.e. warmup-stable-decay across the two phases:
- pretrain: 1.7T tokens at sequence 1024, batch 4608 (4.7M tokens, 360k steps), global and local
  RoPE theta 10k, learning rate 8e-4 after a 3B-token warmup (636 steps), then constant (no decay).
- extend (start from the pretrain workdir with --config.init_from): global theta raised to 160k,
  sequences of 8192, 300B tokens (batch 576 x 8192, the same 4.7M tokens; 63.6k steps) at 3e-4:
  constant for 250B tokens, then a 1-sqrt decay to 0 over the last 50B (decay_fraction 1/6).
Not reproduced: the paper's batch-size warmup (over its first 50B tokens), its dropout of 0.1 on the
attention output only (our dropouts are on every residual branch or on the attention probabilities,
which would rule out splash attention: dropout is 0 here), and its data (a 2T-token mix of web, code
and scientific text) and tokenizer (OLMo's BPE; a sentencepiece BPE of the same size here).
Runtime: not measured here (no accelerator at hand). Expected: GLUE average 88.4 after fine-tuning
(the paper's Table 1); the paper reports no held-out MLM accuracy.
"""
from mlm_jax.config.defaults import default_config

TOKENS_PER_BATCH = 4608 * 1024


def get_config(phase="pretrain"):
  phase = phase or "pretrain"
  if phase not in ("pretrain", "extend"):
    raise ValueError(f"configs/modernbert_base.py:{phase}: expected pretrain or extend")
  extend = phase == "extend"
  seq_len = 8192 if extend else 1024
  c = default_config()
  c.model.update(dict(
      vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
      max_position_embeddings=8192, type_vocab_size=0, position_offset=0, layer_norm_eps=1e-5,
      norm="pre", positions="rotary", mlp="geglu", embedding_norm=True, first_layer_attention_norm=False,
      attention_bias=False, mlp_bias=False, norm_bias=False, head_bias=False,
      global_attention_every=3, local_window=128, rope_theta=160_000.0 if extend else 10_000.0,
      rope_theta_local=10_000.0, hidden_dropout=0.0, attention_dropout=0.0, dtype="bfloat16", scan_layers=True))
  c.tokenizer.update(dict(layout="xlmr", model_type="bpe", vocab_size=50368))
  c.data.sources = ("store:/data/store/modernbert",)   # tools/prepare_data.py output (tokenizer inside)
  c.data.seq_len = seq_len
  c.data.packing = "segmented"
  c.masking.mask_rate = 0.3
  c.optimizer.update(dict(schedule="wsd", learning_rate=3e-4 if extend else 8e-4,
                          warmup_steps=0 if extend else 636, decay_fraction=1 / 6 if extend else 0.0,
                          decay_shape="1-sqrt", end_lr_ratio=0.0, b1=0.9, b2=0.98, eps=1e-6,
                          weight_decay=1e-5, clip_norm=0.0, update_clip_rms=1.0))
  batch = TOKENS_PER_BATCH // seq_len
  c.train.update(dict(steps=63_600 if extend else 360_000, batch_size=batch, log_every=100,
                      eval_every=5_000, save_every=2_000))
  c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
  return c
