"""CLAMS (Mueller et al., ACL 2020): subject-verb agreement minimal pairs in English, German, French, Russian
and Hebrew, DATA/zeroshot/clams/LANG/PHENOMENON.txt.gz (Apache-2.0; ../shared/data/SOURCES.md section 4.2).

Each line is `True` or `False`, a tab and a sentence, strictly alternating: a grammatical sentence and then
its ungrammatical twin, so pair k is lines 2k-1 and 2k. A set is one file: a phenomenon in one language.
Sentences are as the files give them (lower case, no final period).
"""
from __future__ import annotations

import glob
import os

from mlm_jax.errors import DataError
from mlm_jax.tasks.minimal_pairs import PairSet, spread, text_of

FOLDER = os.path.join("zeroshot", "clams")
SUFFIX = ".txt.gz"


def folder(data: str) -> str:
  return os.path.join(data, FOLDER)


def languages(where: str) -> list:
  """The language folders of CLAMS (en, de, fr, ru, he), sorted."""
  if not os.path.isdir(where):
    raise DataError(f"{where}: no such folder (CLAMS, LANG/*{SUFFIX}; see ../shared/data/SOURCES.md)")
  langs = sorted(d for d in os.listdir(where) if glob.glob(os.path.join(where, d, "*" + SUFFIX)))
  if not langs:
    raise DataError(f"{where}: no LANG/*{SUFFIX} files (CLAMS's languages expected)")
  return langs


def read_file(path: str, limit: int = 0, language: str = "") -> PairSet:
  """`limit` pairs (0 = all) of one file at evenly spaced positions (its first pairs differ in one word only:
  minimal_pairs.spread); a line that breaks the True/False alternation is an error naming file and line."""
  good, bad = [], []
  expect = "True"
  number = 0
  for number, line in enumerate(text_of(path).splitlines(), 1):
    if not line.strip():
      continue
    label, tab, sentence = line.partition("\t")
    if not tab or label not in ("True", "False") or not sentence.strip():
      raise DataError(f"{path}:{number}: expected 'True' or 'False', a tab and a sentence")
    if label != expect:
      raise DataError(f"{path}:{number}: expected a {expect!r} line ("
                      f"{'a grammatical sentence' if expect == 'True' else 'the ungrammatical twin of the line before'}"
                      f"), got {label!r}: the lines must alternate True, False")
    (good if label == "True" else bad).append(sentence.strip())
    expect = "False" if label == "True" else "True"
  if expect == "False":
    raise DataError(f"{path}:{number}: the last 'True' line has no 'False' twin")
  if not good:
    raise DataError(f"{path}: no minimal pairs")
  phenomenon = os.path.basename(path)[:-len(SUFFIX)]
  return spread(PairSet(f"{language}/{phenomenon}", phenomenon, tuple(good), tuple(bad), language), limit)


def read(where: str, limit: int = 0, langs=()) -> list:
  """Every file of the given languages (default: all), `limit` pairs each spread over it (0 = all): one set
  per language and phenomenon, languages sorted, files sorted."""
  have = languages(where)
  unknown = [lang for lang in langs if lang not in have]
  if unknown:
    raise DataError(f"CLAMS has no language {unknown[0]!r} in {where} (it has {', '.join(have)})")
  return [read_file(p, limit, lang) for lang in (langs or have)
          for p in sorted(glob.glob(os.path.join(where, lang, "*" + SUFFIX)))]


def sample(where: str, per_language: int, langs=()) -> list:
  """A fixed sample of `per_language` pairs of each language (the probe's), spread over its files (a file
  gets an equal share, the first files one more) and over each file."""
  sets = read(where, 0, langs)
  out = []
  for lang in dict.fromkeys(s.group for s in sets):
    mine = [s for s in sets if s.group == lang]
    for j, s in enumerate(mine):
      k = per_language // len(mine) + (j < per_language % len(mine))
      if k:
        out.append(spread(s, k))
  return out
