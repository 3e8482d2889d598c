"""ModernBERT-base (Warner et al., 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder for
Fast, Memory Efficient, and Long Context Finetuning and Inference", arXiv:2412.13663) as one run in phases
(default): a batch-size warmup, pretraining at 1024 tokens, the context extension to 8192 and the decay.
`:pretrain` and `:extend` are those phases alone, as separate runs (the second with --config.init_from).

  python tools/train_tokenizer.py --input='/data/corpus/en/*.txt' --vocab_size=50368 --model_type=bpe --out=spm_bpe50k
  # once: a token store (beyond one machine: --runner=DataflowRunner, docs/token_store.md)
  python tools/prepare_data.py --sources='en=/data/corpus/en/*.txt' --tokenizer=spm_bpe50k.model \
      --out=/data/store/modernbert --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert   # all phases
  # a decay from any checkpoint of the stable part (docs/phases.md#branching):
  python -m mlm_jax.train --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert_decay_at_300k \
      --config.branch_from=gs://BUCKET/modernbert:300000
  python tools/merge_checkpoints.py --workdir=gs://BUCKET/modernbert --last=3 --out=gs://BUCKET/modernbert_merged
  python tools/convert_checkpoint.py to_hf --workdir=gs://BUCKET/modernbert_merged --out=modernbert_hf   # ModernBertForMaskedLM
  # will it fit, phase by phase: python tools/aot_compile.py --config=configs/modernbert_base.py --topology=v5p:2x2x2

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
The learning rate is trapezoidal, i.e. warmup-stable-decay across the phases (ends in tokens):
- batch warmup: batches of 768, 1536 and 3072 x 1024 tokens up to 12.5B, 25B and 50B tokens (the paper
  grows the batch from 768 to 4608 over its first 50B tokens; these three sizes are this file's choice).
- pretrain: to 1.7T tokens at sequence 1024, batch 4608 (4.7M tokens), global and local RoPE theta 10k,
  learning rate 8e-4 after a 3B-token warmup (optimizer.warmup_tokens), then constant.
- extend: global theta raised to 160k, sequences of 8192, batch 512 (4.2M tokens), 250B tokens at a
  constant 3e-4.
- decay: the last 50B tokens, 3e-4 to 0 with a 1-sqrt shape (the paper's decay phase), batch 512 x 8192.
Batch sizes: every phase's batch is a multiple of 256, so that it splits over the batch axes of every
power-of-two slice up to 256 chips (fsdp over the slice: v5p-512 = 4x4x16 is 256 chips; 512 also splits
over 512). The extend and decay phases keep the pretraining batch's tokens, 4608 x 1024 = 4.7M, as
nearly as that allows: 576 x 8192 would be the same 4.7M, but 576 does not split over 128 chips or more
(`tools/aot_compile.py --topology=v5p:4x4x8` reports that phase as not placeable), so 512 x 8192 =
4.2M tokens (11% fewer per step, ~12% more steps for the same 250B + 50B tokens: phase ends are in
tokens). 640 would split over 128 chips but not 256; 768 x 8192 = 6.3M tokens is the next multiple of 256.
Not reproduced: its dropout of 0.1 on the
attention output only (our dropouts are on every residual branch or on the attention probabilities,
which would rule out splash attention: dropout is 0 here), and its data (a 2T-token mix of web, code
and scientific text) and tokenizer (OLMo's BPE; a sentencepiece BPE of the same size here).
Runtime: not measured here (no accelerator at hand). Expected: GLUE average 88.4 after fine-tuning
(the paper's Table 1); the paper reports no held-out MLM accuracy.
"""
from mlm_jax.config.defaults import default_config

LONG_BATCH = 512   # sequences of 8192 tokens: a multiple of 256 (the docstring says why not 576)


def get_config(phase=""):
  phase = phase or ""
  if phase not in ("", "pretrain", "extend"):
    raise ValueError(f"configs/modernbert_base.py:{phase}: expected no variant (all phases), pretrain or extend")
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
  batch = 4608 if not extend else LONG_BATCH
  c.train.update(dict(steps=71_600 if extend else 360_000, batch_size=batch, log_every=100,
                      eval_every=5_000, save_every=2_000))
  c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
  if not phase:
    _phases(c)
  return c


def _phases(c):
  """One run: batch warmup, pretrain, extend, decay (the pretrain config above is its start)."""
  c.optimizer.update(dict(schedule="constant", warmup_steps=0, warmup_tokens=3_000_000_000))
  c.train.save_every = 2_000
  B = 1_000_000_000
  lr_extend = dict(**{"optimizer.learning_rate": 3e-4, "optimizer.schedule": "constant", "optimizer.warmup_steps": 0})
  c.phases = (
      {"name": "batch768", "end_tokens": 12 * B + B // 2, "train.batch_size": 768},
      {"name": "batch1536", "end_tokens": 25 * B, "train.batch_size": 1536},
      {"name": "batch3072", "end_tokens": 50 * B, "train.batch_size": 3072},
      {"name": "pretrain", "end_tokens": 1_700 * B, "train.batch_size": 4608},
      {"name": "extend", "end_tokens": 1_950 * B, "data.seq_len": 8192, "train.batch_size": LONG_BATCH,
       "model.rope_theta": 160_000.0, **lr_extend},
      {"name": "decay", "end_tokens": 2_000 * B, "optimizer.schedule": "wsd", "optimizer.decay_fraction": 1.0,
       "optimizer.decay_shape": "1-sqrt"},
  )
