"""The tokenizer interface: what every consumer may ask of a tokenizer, whatever its family.

Every consumer gets a `Tokenizer` from `load.load(path)`, so special ids, the word-start rule and the
layout (`xlmr`: <s> A </s></s> B </s>; `bert`: [CLS] A [SEP] B [SEP]) are decided once per family.
A leaf: the families import it, it imports none. Ids and rules: docs/design_notes.md#base.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, ClassVar, Sequence

LAYOUTS = ("xlmr", "bert")
FAMILIES = ("sentencepiece", "wordpiece", "bpe")
PIECES = {
    "xlmr": dict(bos="<s>", pad="<pad>", eos="</s>", unk="<unk>", mask="<mask>"),
    "bert": dict(bos="[CLS]", pad="[PAD]", eos="[SEP]", unk="[UNK]", mask="[MASK]"),
}


def special_ids_path(model_path: str) -> str:
  base = model_path[:-len(".model")] if model_path.endswith(".model") else model_path
  return base + ".special_ids.json"


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A loaded tokenizer of one family plus its special ids (immutable, cheap to pass around).

  `model_path` is the file it was loaded from (`.model`, `tokenizer.json`, `vocab.txt`, ...).
  Every method that encodes text returns ids without BOS/EOS: callers add the layout's own.
  """
  model_path: str
  layout: str
  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int
  unk_id: int
  mask_id: int
  family: ClassVar[str] = ""

  @property
  def special_ids(self) -> tuple:
    return tuple(sorted({self.pad_id, self.bos_id, self.eos_id, self.unk_id, self.mask_id}))

  @property
  def mask_token(self) -> str:
    """The mask token as written in text (`<mask>`, `[MASK]`)."""
    return self.id_to_piece(self.mask_id)

  @property
  def mask_takes_left_space(self) -> bool:
    """Whether the mask token absorbs the space before it in text (RoBERTa's `<mask>`, lstrip)."""
    return False

  def encode(self, text: str) -> list:
    """Token ids of `text`, without BOS/EOS."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list:
    raise NotImplementedError

  def encode_words(self, words: Sequence[str]) -> list:
    """Ids per word of a pre-split sentence (NER), each word as it reads inside the sentence."""
    return self.encode_batch(words)

  def encode_offsets(self, text: str) -> tuple:
    """(ids, [(first char, end char)] per id) of `text` (QA answer spans)."""
    raise NotImplementedError

  def decode(self, ids) -> str:
    raise NotImplementedError

  def id_to_piece(self, i: int) -> str:
    raise NotImplementedError

  def piece_to_id(self, piece: str) -> int:
    raise NotImplementedError

  def normalize(self, text: str) -> str:
    raise NotImplementedError

  def word_start_table(self) -> list:
    """Per id: 1 if the piece starts a word (or is special), else 0."""
    raise NotImplementedError

  def after_space_table(self):
    """Per id: 1 if the piece ends in whitespace, so the next piece starts a word; None if no piece does.

    Byte-level BPE spells a tab or newline as a piece of its own ('ĉ', 'Ċ') and the word after it
    has no 'Ġ'; sentencepiece and WordPiece never end a piece in whitespace.
    """
    return None

  def tf_tokenize(self) -> Callable:
    """A function: tf.string [n] -> tf.RaggedTensor int32 [n, None] of ids (tf.data maps)."""
    raise NotImplementedError

  def files(self) -> dict:
    """{file name: bytes}: the files that define this tokenizer, to copy next to a store or a model.

    The folder they are written to loads (`load(folder)`) as this same tokenizer.
    """
    raise NotImplementedError

  @property
  def main_file(self) -> str:
    """The name among `files()` that `load` takes as the tokenizer's path."""
    raise NotImplementedError

  @property
  def sha256(self) -> str:
    """Identity of the vocabulary and the encoding rules (a store records it)."""
    files = self.files()
    if len(files) == 1 or self.family == "sentencepiece":
      return hashlib.sha256(files[self.main_file]).hexdigest()
    h = hashlib.sha256()
    for name in sorted(files):
      h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()
