#!/usr/bin/env python
"""Train a sentencepiece tokenizer for mlm_jax (unigram or BPE, XLM-R or BERT special tokens).

  python tools/train_tokenizer.py --input='corpus/*/*.txt.gz' --vocab_size=250000 --out=spm/xlmr

Each --input is `name=spec` (one language) or a glob; a glob is split into one language per
value of its first wildcard path component (`corpus/*/...` -> one per language folder).
Languages are sampled with q_i ∝ n_i^alpha (n_i = lines), so small languages get their share
of the vocabulary. Writes OUT.model, OUT.vocab and OUT.special_ids.json; the training
pipeline reads the model with `mlm_jax.data.tokenizers.load.load(OUT.model)`.
"""
import argparse

from mlm_jax import runtime

from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import UserError


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--input", action="append", required=True,
                 help="name=spec or glob; repeat for several (specs: GLOB, tsv:FIELD:GLOB, jsonl:FIELD:GLOB)")
  p.add_argument("--out", required=True, help="output prefix (writes OUT.model, OUT.vocab, ...)")
  p.add_argument("--vocab_size", type=int, default=32000)
  p.add_argument("--layout", choices=tokenizer_base.LAYOUTS, default="xlmr")
  p.add_argument("--model_type", choices=("unigram", "bpe"), default="unigram")
  p.add_argument("--alpha", type=float, default=0.3, help="language sampling exponent")
  p.add_argument("--max_sentences_per_language", type=int, default=1_000_000)
  p.add_argument("--input_sentence_size", type=int, default=2_000_000)
  p.add_argument("--character_coverage", type=float, default=0.9995)
  p.add_argument("--no_byte_fallback", action="store_true")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--num_threads", type=int, default=0)
  p.add_argument("--quiet", action="store_true", help="no progress output")
  runtime.add_verbosity_flag(p)
  a = p.parse_args(argv)
  try:
    tok = spm_training.train(
        a.input, a.out, vocab_size=a.vocab_size, layout=a.layout, model_type=a.model_type,
        alpha=a.alpha, max_sentences_per_language=a.max_sentences_per_language,
        input_sentence_size=a.input_sentence_size, character_coverage=a.character_coverage,
        byte_fallback=not a.no_byte_fallback, seed=a.seed, num_threads=a.num_threads,
        verbose=not a.quiet, spm_log=None if a.verbosity >= 1 else "")
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  print(tok.model_path)
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
