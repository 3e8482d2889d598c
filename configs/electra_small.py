"""ELECTRA-Small (Clark et al., 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
Generators", arXiv:2003.10555): replaced-token detection with a generator at 1/4 size.

  python tools/prepare_data.py --sources='en=/data/corpus/en/*.txt' --tokenizer=spm_bert.model \
      --out=/data/store/electra_small --num_workers=16 --eval_percent=0.1
  python -m mlm_jax.train --config=configs/electra_small.py --workdir=/tmp/electra_small
  python tools/convert_checkpoint.py to_hf --workdir=/tmp/electra_small --out=/tmp/electra_small_hf
  #   -> OUT/discriminator (ElectraForPreTraining: fine-tune this) and OUT/generator (ElectraForMaskedLM)
  python -m mlm_jax.finetune --config=configs/finetune/sms_spam.py --init_from=/tmp/electra_small \
      --workdir=/tmp/ft_spam   # starts from the discriminator

Recipe (the paper's Table 6): discriminator 12 layers x 256 hidden, 4 heads, FFN 1024, embeddings 128
and their LayerNorm shared with the generator (hidden, heads and FFN at 1/4: 64, 1, 256; 12 layers), 1M steps of 128 x 128
tokens, Adam lr 5e-4 without bias correction (the reference's AdamWeightDecayOptimizer), 10k warmup
steps then linear decay, weight decay 0.01, eps 1e-6, dropout 0.1,
15% of the tokens masked ([MASK] 85% of the time, the token kept otherwise, as the released code
does), loss = MLM + 50 x replaced-token detection, WordPiece vocabulary of 30522 (here a
sentencepiece model with the BERT layout). Hardware: one GPU (the paper: 4 days on one V100; not
timed here). Expected: the paper's ELECTRA-Small reaches GLUE dev 79.9 / test
77.4 (BERT-Small with the same compute: 75.1); not reproduced here (no GLUE run, no GPU at hand).

Demo variant (CPU, minutes): `--config=configs/electra_small.py:demo` is configs/demo.py's
2 x 128 model (RoBERTa-style tokenizer trained on the demo corpus) as the discriminator, with a
32-wide generator, 800 steps of 32 x 64 tokens, Adam at lr 5e-4 without bias correction:
  python -m mlm_jax.train --config=configs/electra_small.py:demo --workdir=/tmp/electra_demo
Expected (measured on the shared English sentences, corpus/en/leipzig, 520 steps, the FLOPs of 600
MLM steps of configs/demo.py; ~9 min on a busy 2-core VM): held-out generator MLM loss 8.3 -> 6.2
(accuracy 0.13), discriminator loss 0.69 -> 0.38 with accuracy 0.86, i.e. still at the rate of
"nothing replaced" (13% of the tokens are): a budget this small teaches the discriminator the prior,
hardly more. docs/objectives.md (ELECTRA) compares it with MLM at equal FLOPs. (Measured before the
embedding LayerNorm was shared, Adam's bias correction dropped and lr 5e-4 chosen. With all three,
on the same sentences at 520 steps: generator MLM loss 6.41, discriminator loss
0.384, held-out AUC 0.61; docs/objectives.md has the recipe screen.)
"""
import importlib.util
import os

from mlm_jax.config.defaults import default_config

SIZES = ("small", "demo")


def get_config(size="small"):
  size = (size or "small").removeprefix("size=")
  if size not in SIZES:
    raise ValueError(f"configs/electra_small.py:{size}: expected one of {SIZES}")
  if size == "demo":
    spec = importlib.util.spec_from_file_location("demo", os.path.join(os.path.dirname(__file__), "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    c = demo.get_config()
    c.objective = "electra"
    # transformers' ELECTRA numbers positions from 0 (to_hf checks it).
    c.model.update(dict(position_offset=0, max_position_embeddings=64, embedding_size=128))
    c.electra.update(dict(generator_hidden_size=32, generator_num_heads=1, generator_intermediate_size=128,
                          disc_weight=50.0))
    c.masking.update(dict(mask_token_prob=0.85, random_token_prob=0.0))
    c.optimizer.bias_correction = False   # the reference's AdamWeightDecayOptimizer
    # The paper's Small rate: the best held-out AUC of the recipe screen in docs/objectives.md.
    c.optimizer.learning_rate = 5e-4
    return c

  c = default_config()
  c.objective = "electra"
  c.model.update(dict(vocab_size=30522, hidden_size=256, embedding_size=128, num_layers=12, num_heads=4,
                      intermediate_size=1024, max_position_embeddings=512, type_vocab_size=2, position_offset=0,
                      layer_norm_eps=1e-12, hidden_dropout=0.1, attention_dropout=0.1, dtype="bfloat16"))
  c.electra.update(dict(generator_hidden_size=64, generator_num_heads=1, generator_intermediate_size=256,
                        generator_num_layers=12, disc_weight=50.0))
  c.tokenizer.layout = "bert"
  c.tokenizer.vocab_size = 30522
  c.data.sources = ("store:/data/store/electra_small",)   # tools/prepare_data.py output (tokenizer inside)
  c.data.seq_len = 128
  c.data.packing = "segmented"
  c.masking.update(dict(mask_rate=0.15, mask_token_prob=0.85, random_token_prob=0.0))
  c.optimizer.update(dict(learning_rate=5e-4, warmup_steps=10_000, schedule="linear", b1=0.9, b2=0.999,
                          eps=1e-6, weight_decay=0.01, clip_norm=1.0, bias_correction=False))
  c.train.update(dict(steps=1_000_000, batch_size=128, log_every=100, eval_every=10_000, eval_batches=20,
                      save_every=10_000, keep_checkpoints=3))
  return c
