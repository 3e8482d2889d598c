#!/usr/bin/env python
"""The peer at equal compute: transformers' RobertaForMaskedLM trained by the transformers Trainer with its
default MLM recipe, on the CPU recipe's corpora with its tokenizer; the folder it writes is what
`python -m mlm_jax.downstream --init_from=OUT --tasks=blimp` scores, with the same scorer as our models.

It runs in its own venv, not mlm_jax's (it imports neither mlm_jax nor jax): the Trainer needs `accelerate`,
which ../shared/bench's peer venv (transformers 4.57.6, torch 2.13.0 CPU) does not have. Made once with
pip (the CPU torch wheel first and alone, as ../shared/bench/setup_peers.sh does):

  python3 -m venv /tmp/peer-trainer && /tmp/peer-trainer/bin/pip install torch==2.13.0
  /tmp/peer-trainer/bin/pip install transformers==4.57.6 sentencepiece accelerate -c ../shared/bench/peers-freeze.txt
  python tools/convert_checkpoint.py to_hf --workdir=/tmp/en_hour --out=/tmp/en_hour_hf   # the recipe's tokenizer
  /tmp/peer-trainer/bin/python tools/peer_trainer_mlm.py --tokenizer=/tmp/en_hour_hf --out=/tmp/peer \\
      --flops=3.262e14                                      # configs/en_cpu_hour.py's 6000 x 13.27 MFLOP x 4096
  python -m mlm_jax.downstream --init_from=/tmp/peer --tasks=blimp

What is the recipe's and what is the peer's: the model is the recipe's size (RoBERTa layout, 4 x 192, 3
heads, FFN 768, 130 positions, the tokenizer's vocabulary); the data are the same files (default: the
recipe's English sources under $MLM_JAX_DATA/corpus/en), every document tokenized with <s> ... </s>,
concatenated and cut into `--seq_len` blocks (run_mlm.py's group_texts; no held-out split); the rest is the
Trainer's and the collator's defaults unless a flag says otherwise: DataCollatorForLanguageModeling (15%,
80/10/10), AdamW (lr 5e-5, betas 0.9 / 0.999, eps 1e-8, no weight decay, no warmup), a linear decay to 0,
gradient clipping at 1.0, dropout 0.1 (RobertaConfig's). Compute: `--flops` is divided by the model FLOPs
of a token as mlm_jax counts them (model/flops.py) with the LM head on every position, as transformers
computes it (6 x layer matmul parameters + 12 x layers x hidden x seq_len + 6 x (hidden^2 + hidden x vocab)),
giving the steps; or give `--max_steps`. The last line printed is a JSON summary.
"""
import argparse
import glob
import gzip
import json
import math
import os
import shutil
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                    "shared", "data"))
_EN = os.path.join(_DATA, "corpus", "en")
# configs/en_cpu_hour.py's SOURCES (books as blank-line paragraphs, Leipzig's sentences, column 1 of its TSV)
SOURCES = (
    ",".join(os.path.join(_EN, g) for g in ("gutenberg_nltk/*.txt.gz", "gutenberg_kalamine/*.txt.gz",
                                           "botchan.txt.gz", "tinyshakespeare.txt.gz")),
    "tsv:1:" + os.path.join(_EN, "leipzig", "*.txt.gz"),
)


# files of a transformers folder that are not its tokenizer's
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "generation_config.json", "training_args.bin")


def _open(path):
  return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace") if path.endswith(".gz") else \
      open(path, encoding="utf-8-sig", errors="replace")


def documents(spec: str):
  """Texts of one source spec: GLOB[,GLOB] (blank-line-separated documents) or tsv:FIELD:GLOB (a line each)."""
  field = None
  if spec.startswith("tsv:"):
    _, field, spec = spec.split(":", 2)
  paths = sorted(p for g in spec.split(",") for p in glob.glob(g))
  if not paths:
    raise SystemExit(f"no files match {spec!r} (set MLM_JAX_DATA or pass --sources)")
  for path in paths:
    with _open(path) as f:
      if field is not None:
        for line in f:
          cols = line.rstrip("\n").split("\t")
          if len(cols) > int(field) and cols[int(field)].strip():
            yield cols[int(field)].strip()
        continue
      block = []
      for line in f:
        if line.strip():
          block.append(line.strip())
        elif block:
          yield " ".join(block)
          block = []
      if block:
        yield " ".join(block)


def flops_per_token(hidden: int, layers: int, ffn: int, vocab: int, seq_len: int) -> float:
  """Model FLOPs of one training token with the LM head on every position (mlm_jax's dense_flops_per_token)."""
  return 6 * layers * (4 * hidden * hidden + 2 * hidden * ffn) + 12 * hidden * seq_len * layers + \
      6 * (hidden * hidden + hidden * vocab)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tokenizer", required=True, help="a folder AutoTokenizer loads (to_hf of a recipe run)")
  p.add_argument("--out", required=True, help="the RobertaForMaskedLM folder to write")
  p.add_argument("--sources", nargs="*", default=list(SOURCES), help="GLOB[,GLOB] or tsv:FIELD:GLOB (default: the recipe's)")
  budget = p.add_mutually_exclusive_group(required=True)
  budget.add_argument("--flops", type=float, help="training FLOPs (model FLOPs, head on every position)")
  budget.add_argument("--max_steps", type=int)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--hidden", type=int, default=192)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=3)
  p.add_argument("--ffn", type=int, default=768)
  p.add_argument("--dropout", type=float, default=0.1, help="RobertaConfig's default")
  p.add_argument("--learning_rate", type=float, default=5e-5, help="the Trainer's default")
  p.add_argument("--adam_beta2", type=float, default=0.999, help="the Trainer's default (the recipe: 0.98)")
  p.add_argument("--adam_epsilon", type=float, default=1e-8, help="the Trainer's default (the recipe: 1e-6)")
  p.add_argument("--warmup_ratio", type=float, default=0.0)
  p.add_argument("--weight_decay", type=float, default=0.0)
  p.add_argument("--mlm_probability", type=float, default=0.15)
  p.add_argument("--bf16", action="store_true", help="the Trainer's --bf16 (autocast on CPU)")
  p.add_argument("--max_documents", type=int, default=0, help="read at most this many documents (0 = all)")
  p.add_argument("--seed", type=int, default=42, help="the Trainer's default")
  args = p.parse_args(argv)

  import numpy as np
  import torch
  import transformers
  from transformers import (AutoTokenizer, DataCollatorForLanguageModeling, RobertaConfig, RobertaForMaskedLM,
                            Trainer, TrainingArguments)
  transformers.logging.set_verbosity_warning()
  t0 = time.perf_counter()
  tok = AutoTokenizer.from_pretrained(args.tokenizer)
  ids, n_docs = [], 0
  texts = (d for spec in args.sources for d in documents(spec))
  batch = []
  for text in texts:
    batch.append(text)
    n_docs += 1
    if len(batch) == 1000 or (args.max_documents and n_docs >= args.max_documents):
      ids.extend(tok(batch, add_special_tokens=True)["input_ids"])
      batch = []
      if args.max_documents and n_docs >= args.max_documents:
        break
  if batch:
    ids.extend(tok(batch, add_special_tokens=True)["input_ids"])
  stream = np.fromiter((i for doc in ids for i in doc), np.int64)
  blocks = torch.from_numpy(stream[:len(stream) // args.seq_len * args.seq_len].reshape(-1, args.seq_len))
  tokenize_s = time.perf_counter() - t0

  vocab = len(tok)
  fpt = flops_per_token(args.hidden, args.layers, args.ffn, vocab, args.seq_len)
  steps = args.max_steps or int(args.flops // (fpt * args.batch_size * args.seq_len))
  config = RobertaConfig(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, intermediate_size=args.ffn,
                         max_position_embeddings=args.seq_len + tok.pad_token_id + 1, type_vocab_size=1,
                         layer_norm_eps=1e-5, hidden_dropout_prob=args.dropout,
                         attention_probs_dropout_prob=args.dropout, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
  torch.manual_seed(args.seed)
  model = RobertaForMaskedLM(config)

  class Blocks(torch.utils.data.Dataset):
    def __len__(self):
      return len(blocks)

    def __getitem__(self, i):
      return {"input_ids": blocks[i]}

  training = TrainingArguments(
      output_dir=tempfile.mkdtemp(prefix="peer_trainer_"), max_steps=steps, per_device_train_batch_size=args.batch_size,
      learning_rate=args.learning_rate, adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon,
      warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
      logging_steps=max(1, steps // 20), save_strategy="no", report_to=[], seed=args.seed, use_cpu=True,
      bf16=args.bf16, dataloader_num_workers=0)
  collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=args.mlm_probability)
  trainer = Trainer(model=model, args=training, train_dataset=Blocks(), data_collator=collator)
  t1 = time.perf_counter()
  result = trainer.train()
  train_s = time.perf_counter() - t1
  trainer.save_model(args.out)
  for name in os.listdir(args.tokenizer):   # the tokenizer's own files (a sentencepiece .model our readers need)
    if name not in MODEL_FILES and os.path.isfile(os.path.join(args.tokenizer, name)):
      shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
  tokens = steps * args.batch_size * args.seq_len
  summary = dict(out=args.out, steps=steps, tokens=tokens, flops=fpt * tokens, flops_per_token=fpt,
                 documents=n_docs, corpus_tokens=int(len(stream)), epochs=tokens / max(1, blocks.numel()),
                 final_loss=float(result.training_loss), tokenize_s=round(tokenize_s, 1), train_s=round(train_s, 1),
                 tokens_per_sec=round(tokens / train_s, 1), transformers=transformers.__version__,
                 torch=torch.__version__, learning_rate=args.learning_rate, adam_beta2=args.adam_beta2,
                 adam_epsilon=args.adam_epsilon, dropout=args.dropout, bf16=args.bf16)
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
