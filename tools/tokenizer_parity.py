#!/usr/bin/env python
"""Our tokenizer against transformers' AutoTokenizer on the same folder, line by line.

  python tools/tokenizer_parity.py --hf_dir=../shared/data/models/all-MiniLM-L6-v2 \\
      --corpus='../shared/data/corpus/*'
  python tools/tokenizer_parity.py --train_bpe=/tmp/roberta_bpe --corpus='../shared/data/corpus/*'

Each line, read as prepare reads it, is encoded by our `load(FOLDER)` and by AutoTokenizer; prints per
language folder the lines whose ids differ. --train_bpe=DIR first trains a byte-level BPE tokenizer on
the corpus and checks that (docs/design_notes.md#toolstokenizer_paritypy).
"""
import argparse
import glob
import json
import os
import sys

import mlm_jax  # noqa: F401  (its import sets the process up before jax or TensorFlow is imported)


def corpus_lines(language_dir: str, max_lines: int = 0) -> list:
  """Every non-blank line of every file under `language_dir`, as the text reader yields it."""
  from mlm_jax.data.store import text_reader
  out = []
  files = sorted(p for p in glob.glob(os.path.join(language_dir, "**", "*"), recursive=True)
                 if os.path.isfile(p) and not p.endswith(".md"))
  for path in files:
    counters = text_reader.Counters()
    for doc in text_reader.documents(path, -1, "line", 1 << 16, counters):
      out.append(doc[0])
      if max_lines and len(out) >= max_lines:
        return out
  return out


def compare(tok, hf_tok, lines: list) -> list:
  """[(line, ours, theirs)] for the lines whose ids differ."""
  ours = tok.encode_batch(lines)
  theirs = hf_tok(lines, add_special_tokens=True)["input_ids"]
  return [(line, [tok.bos_id] + a + [tok.eos_id], b) for line, a, b in zip(lines, ours, theirs)
          if [tok.bos_id] + a + [tok.eos_id] != list(b)]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hf_dir", default="", help="a transformers folder with tokenizer files")
  p.add_argument("--train_bpe", default="", help="train a byte-level BPE RoBERTa folder here and check it")
  p.add_argument("--bpe_vocab_size", type=int, default=8000)
  p.add_argument("--corpus", required=True, help="glob of language folders")
  p.add_argument("--max_lines", type=int, default=0, help="per language (0 = all)")
  p.add_argument("--show", type=int, default=5, help="differing lines printed per language")
  a = p.parse_args(argv)
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import transformers
  from mlm_jax.data.tokenizers import hf_tokenizers
  from mlm_jax.data.tokenizers import load as tokenizer_load
  transformers.logging.set_verbosity_error()
  langs = {os.path.basename(d.rstrip("/")): d for d in sorted(glob.glob(a.corpus)) if os.path.isdir(d)}
  folder = a.hf_dir
  if a.train_bpe:
    sample = [line for d in langs.values() for line in corpus_lines(d, 3000)]
    hf_tokenizers.train_bpe(sample, a.train_bpe, a.bpe_vocab_size)
    folder = a.train_bpe
  tok = tokenizer_load.load(folder)
  hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
  print(f"ours: {tok}\ntheirs: {type(hf_tok).__name__}")
  report = {}
  for lang, d in langs.items():
    lines = corpus_lines(d, a.max_lines)
    diff = compare(tok, hf_tok, lines)
    report[lang] = dict(lines=len(lines), differ=len(diff),
                        equal_percent=round(100.0 * (1 - len(diff) / max(len(lines), 1)), 4))
    print(f"{lang}: {len(lines)} lines, {len(diff)} differ ({report[lang]['equal_percent']}% equal)")
    for line, ours, theirs in diff[:a.show]:
      print(f"  {line!r}\n    ours   {ours}\n    theirs {theirs}")
  print(json.dumps(report))
  return 0 if all(r["differ"] == 0 for r in report.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
