"""XLM-R base and large (Conneau et al., 2020, "Unsupervised Cross-lingual Representation Learning at Scale",
arXiv:1911.02116). `configs/xlmr_large.py` is this file with size=large (also: --config=configs/xlmr_base.py:large).

  python tools/train_tokenizer.py --input='/data/cc100/*/*.txt' --vocab_size=250002 --out=spm250k
  # once: one store, one source per language (beyond one machine: --runner=DataflowRunner, docs/token_store.md)
  python tools/prepare_data.py --sources='en=/data/cc100/en/*.txt' --sources='sw=/data/cc100/sw/*.txt' ... \
      --tokenizer=spm250k.model --out=/data/store/xlmr --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/xlmr_base.py --workdir=gs://BUCKET/xlmr_base
  # languages are mixed by source name inside the store with data.mix_alpha=0.3

Hardware: base: TPU v5p-256 or 256+ GPUs; large: v5p-512 or 512+ GPUs (bf16 compute, fp32 params, fsdp over
the slice). Published recipe: base L12 H768 A12, large L24 H1024 A16, vocab 250002 (sentencepiece unigram, <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=250001),
sequence 512, batch 8192, 1.5M updates, languages sampled with alpha=0.3, Adam (beta2 0.98, eps 1e-6),
weight decay 0.01, linear warmup then linear decay. The paper does not state the peak learning rate;
RoBERTa's values are used here: 6e-4 (base), 4e-4 (large). Runtime: weeks on 500 V100s in the paper.
Expected: held-out MLM accuracy ~0.6 (base) / ~0.65 (large) averaged over languages on CC-100-like text.
"""
from mlm_jax.config import sizes as presets
from mlm_jax.config.defaults import default_config


def get_config(size="base"):
  size = size or "base"
  c = default_config()
  c.model.update(presets.size(size))
  c.model.update(dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, position_offset=2,
                      layer_norm_eps=1e-5, hidden_dropout=0.1, attention_dropout=0.1, dtype="bfloat16"))
  c.tokenizer.update(dict(layout="xlmr", model_type="unigram", vocab_size=250002, alpha=0.3))
  c.data.sources = ("store:/data/store/xlmr",)   # tools/prepare_data.py output (tokenizer inside)
  c.data.store_workers = 2   # batches built by 2 processes beside the trainer (docs/token_store.md)
  c.data.seq_len = 512
  c.data.packing = "concat"
  c.data.mix_alpha = 0.3
  c.optimizer.update(dict(learning_rate={"base": 6e-4, "large": 4e-4}[size], warmup_steps=10_000, schedule="linear", b1=0.9, b2=0.98,
                          eps=1e-6, weight_decay=0.01, clip_norm=1.0))
  c.train.update(dict(steps=1_500_000, batch_size=8192, log_every=100, eval_every=10_000, save_every=5_000))
  c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
  return c
