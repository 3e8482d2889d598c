"""RoBERTa-base (Liu et al., 2019, "RoBERTa: A Robustly Optimized BERT Pretraining Approach", arXiv:1907.11692).

  # once: tokenize the corpus into a token store (beyond one machine: --runner=DataflowRunner, docs/token_store.md)
  python tools/prepare_data.py --sources='en=/data/corpus/en/*.txt' --tokenizer=spm_bpe50k.model \
      --out=/data/store/roberta_base --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/roberta_base.py --workdir=gs://BUCKET/roberta_base

Hardware: TPU v5p-128 or 64+ GPUs (bf16 compute, fp32 params; fsdp over the slice). Published recipe
(Table 9): 500k steps of 8k sequences x 512 tokens, FULL-SENTENCES packing (data.packing='concat'),
dynamic masking, Adam peak lr 6e-4, beta2 0.98, eps 1e-6, weight decay 0.01, 24k warmup then linear
decay, dropout 0.1, no NSP, vocab 50265 (byte-level BPE there; sentencepiece BPE here).
Runtime: ~1 day on 1024 V100s in the paper. Expected: held-out MLM perplexity ~3.7 (paper, on its data).
"""
from mlm_jax.config import sizes as presets
from mlm_jax.config.defaults import default_config


def get_config():
  c = default_config()
  c.model.update(presets.size("base"))
  c.model.update(dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, position_offset=2,
                      layer_norm_eps=1e-5, hidden_dropout=0.1, attention_dropout=0.1, dtype="bfloat16"))
  c.tokenizer.update(dict(layout="xlmr", model_type="bpe", vocab_size=50265))
  c.data.sources = ("store:/data/store/roberta_base",)   # tools/prepare_data.py output (tokenizer inside)
  c.data.store_workers = 2   # batches built by 2 processes beside the trainer (docs/token_store.md)
  c.data.seq_len = 512
  c.data.packing = "concat"
  c.optimizer.update(dict(learning_rate=6e-4, warmup_steps=24_000, schedule="linear", b1=0.9, b2=0.98,
                          eps=1e-6, weight_decay=0.01, clip_norm=0.0))
  c.train.update(dict(steps=500_000, batch_size=8192, log_every=100, eval_every=10_000, save_every=5_000))
  c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
  return c
