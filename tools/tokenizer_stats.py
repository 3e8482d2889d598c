#!/usr/bin/env python
"""How tokenizers spell each language: pieces per word (fertility), words split, unknown and byte pieces.

  python tools/tokenizer_stats.py --tokenizer=xlmr=/tmp/xlmr_hour/tokenizer/spm.model \\
      --tokenizer=en_only=/tmp/en_spm.model --text=en=pud/en.txt --text=de=pud/de.txt \\
      --text=ru='tsv:2:../shared/data/corpus/ru/*.tsv.gz' [--max_lines=1000]

Each --tokenizer is NAME=PATH (a .model, tokenizer.json, vocab.txt or a folder holding one); each
--text is LANG=SPEC with the specs of data.sources (GLOB, tsv:FIELD:GLOB, jsonl:FIELD:GLOB; .gz read transparently), a
line a sentence or paragraph. Words are whitespace-separated, each encoded as it reads in its sentence
(mlm_jax/data/tokenizers/word_stats.py). Prints a table (a row per language, a column group per
tokenizer), then the figures as one JSON object on the last line; errors are one line and exit code 2.
"""
import argparse
import json

from mlm_jax import runtime


def _named(items, what):
  out = {}
  for item in items:
    name, eq, value = item.partition("=")
    if not eq or not name or not value:
      from mlm_jax.errors import UserError
      raise UserError(f"--{what}={item!r}: expected NAME=VALUE")
    out[name] = value
  return out


def read_lines(spec_str: str, max_lines: int) -> list:
  """Non-blank lines of a text-kind source spec, as the store's reader yields them."""
  from mlm_jax.data import specs
  from mlm_jax.data.store import text_reader
  spec = specs.parse_spec(spec_str)
  if spec.kind not in specs.TEXT_KINDS:
    raise specs.DataError(f"--text {spec_str!r}: expected GLOB, tsv:FIELD:GLOB or jsonl:FIELD:GLOB")
  out = []
  for path in specs.list_files(spec.pattern, spec_str):
    for doc in text_reader.documents(path, specs.text_field(spec.kind, spec.arg), "line", 1 << 16,
                                     text_reader.Counters()):
      out.append(doc[0])
      if max_lines and len(out) >= max_lines:
        return out
  if not out:
    raise specs.DataError(f"--text {spec_str!r}: no non-blank lines")
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tokenizer", action="append", required=True, help="NAME=PATH; repeat to compare")
  p.add_argument("--text", action="append", required=True, help="LANG=SPEC; repeat per language")
  p.add_argument("--max_lines", type=int, default=0, help="the first N lines of each --text (0 = all)")
  runtime.add_verbosity_flag(p)
  a = p.parse_args(argv)
  from mlm_jax.data.tokenizers import load, word_stats
  from mlm_jax.errors import UserError
  try:
    toks = {name: load.load(path) for name, path in _named(a.tokenizer, "tokenizer").items()}
    texts = {lang: read_lines(spec, a.max_lines) for lang, spec in _named(a.text, "text").items()}
  except UserError as e:
    runtime.report_user_error(e)
    return 2
  result = {lang: {name: word_stats.word_stats(tok, lines).as_dict() for name, tok in toks.items()}
            for lang, lines in texts.items()}
  head = "| language | words |" + "".join(f" {n}: pieces/word | {n}: words split | {n}: unknown / byte pieces |"
                                          for n in toks)
  print(head)
  print("|" + "---|" * (2 + 3 * len(toks)))
  for lang, by_tok in result.items():
    first = next(iter(by_tok.values()))
    cells = "".join(f" {s['fertility']:.2f} | {100 * s['split_share']:.1f}% | "
                    f"{100 * s['unknown_share']:.2f}% / {100 * s['byte_share']:.2f}% |" for s in by_tok.values())
    print(f"| {lang} | {first['words']:,} |{cells}")
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  runtime.exit_now(main())
