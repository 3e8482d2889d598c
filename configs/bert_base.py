"""BERT-base (Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers", arXiv:1810.04805).

  # once: tokenize the corpus into a token store (beyond one machine: --runner=DataflowRunner, docs/token_store.md)
  python tools/prepare_data.py --sources='en=/data/corpus/en/*.txt' --tokenizer=spm_bert.model \
      --out=/data/store/bert_base --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base
  # another store: --config.data.sources="('store:/mnt/other_store',)"; the store carries its tokenizer

Hardware: a TPU v4-32 / v5p-32 or 8-16 GPUs (fp32 params, bf16 compute). Published recipe: 1M steps of
256 x 512 tokens (the paper trains 90% of steps at 128 and 10% at 512; here all at 512), Adam lr 1e-4,
beta1 0.9, beta2 0.999, eps 1e-6, weight decay 0.01, 10k warmup steps then linear decay, dropout 0.1,
vocab 30522 (WordPiece there; a sentencepiece model with the BERT special layout here), masked-token
prediction only (no NSP). Runtime: ~4 days on 16 TPUv3 chips in the paper.
Expected: held-out MLM accuracy around 0.7 on English Wikipedia+books-like text.
"""
from mlm_jax.config import sizes as presets
from mlm_jax.config.defaults import default_config


def get_config():
  c = default_config()
  c.model.update(presets.size("base"))
  c.model.update(dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, position_offset=0,
                      layer_norm_eps=1e-12, hidden_dropout=0.1, attention_dropout=0.1, dtype="bfloat16"))
  c.tokenizer.layout = "bert"
  c.tokenizer.vocab_size = 30522
  c.data.sources = ("store:/data/store/bert_base",)   # tools/prepare_data.py output (tokenizer inside)
  c.data.store_workers = 2   # batches built by 2 processes beside the trainer (docs/token_store.md)
  c.data.seq_len = 512
  c.data.packing = "segmented"
  c.optimizer.update(dict(learning_rate=1e-4, warmup_steps=10_000, schedule="linear", b1=0.9, b2=0.999,
                          eps=1e-6, weight_decay=0.01, clip_norm=1.0))
  c.train.update(dict(steps=1_000_000, batch_size=256, log_every=100, eval_every=10_000, save_every=10_000))
  c.mesh.update(dict(data=-1, fsdp=1, tensor=1))
  return c
