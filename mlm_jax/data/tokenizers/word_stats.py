"""How a tokenizer spells a language's words: pieces per word (fertility), the share of words split,
unknown pieces (Rust et al., 2021, "How Good is Your Tokenizer?", ACL).

A multilingual model's quality in a language is bounded by how its tokenizer spells that language:
more pieces a word means shorter contexts, costlier pseudo-likelihood (quadratic in the pieces) and
words the model must assemble from fragments. Words are whitespace-separated, each encoded as it reads
inside its sentence (`Tokenizer.encode_words`), so every family is counted by the same rule.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from mlm_jax.data.tokenizers import base

_BYTE = re.compile(r"<0x[0-9A-F]{2}>")


@dataclasses.dataclass
class WordStats:
  lines: int = 0
  words: int = 0
  pieces: int = 0
  split_words: int = 0      # words of two or more pieces
  unknown_pieces: int = 0   # pieces that are the tokenizer's unknown id
  unknown_words: int = 0    # words holding at least one
  byte_pieces: int = 0      # byte-fallback pieces (<0xNN>): characters the vocabulary spells byte by byte

  @property
  def fertility(self) -> float:
    return self.pieces / self.words if self.words else 0.0

  @property
  def split_share(self) -> float:
    return self.split_words / self.words if self.words else 0.0

  @property
  def unknown_share(self) -> float:
    return self.unknown_pieces / self.pieces if self.pieces else 0.0

  @property
  def byte_share(self) -> float:
    return self.byte_pieces / self.pieces if self.pieces else 0.0

  def as_dict(self) -> dict:
    return dict(dataclasses.asdict(self), fertility=self.fertility, split_share=self.split_share,
                unknown_share=self.unknown_share, byte_share=self.byte_share)


def word_stats(tok: base.Tokenizer, lines: Iterable[str]) -> WordStats:
  """The counts of `lines` (each a sentence or paragraph) under `tok`."""
  s = WordStats()
  is_byte = {}
  for line in lines:
    s.lines += 1
    words = line.split()
    for ids in (tok.encode_words(words) if words else []):
      s.words += 1
      s.pieces += len(ids)
      s.split_words += len(ids) > 1
      unknown = sum(i == tok.unk_id for i in ids)
      s.unknown_pieces += unknown
      s.unknown_words += unknown > 0
      for i in ids:
        if i not in is_byte:
          is_byte[i] = _BYTE.fullmatch(tok.id_to_piece(i)) is not None
        s.byte_pieces += is_byte[i]
  return s
