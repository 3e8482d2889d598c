"""The sentencepiece family: a `.model` file (ours, or XLM-R's fairseq `sentencepiece.bpe.model`).

Special ids come from the `<prefix>.special_ids.json` written at training time, or from the pieces;
word starts are pieces beginning with `▁` (and control and unknown pieces). The streaming pipeline
runs the same model in-graph (tensorflow_text), with no Python per batch.
"""
import dataclasses
import json
import os

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from mlm_jax import paths
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.errors import DataError

SPM_FILE = "spm.model"
FAIRSEQ_FILE = "sentencepiece.bpe.model"
_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


@dataclasses.dataclass(frozen=True)
class SentencepieceTokenizer(tokenizer_base.Tokenizer):
  """A sentencepiece model plus its special ids."""
  processor: spm.SentencePieceProcessor = dataclasses.field(default=None, repr=False, compare=False)
  raw: bytes = dataclasses.field(default=b"", repr=False, compare=False)   # the file's bytes, as read
  family = "sentencepiece"

  @property
  def model_proto(self) -> bytes:
    """The serialized model, as tensorflow_text's SentencepieceTokenizer wants it."""
    return self.processor.serialized_model_proto()

  @property
  def main_file(self) -> str:
    return SPM_FILE

  def files(self) -> dict:
    ids = dict(layout=self.layout, pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id,
               unk_id=self.unk_id, mask_id=self.mask_id)
    return {SPM_FILE: self.raw or self.model_proto,
            tokenizer_base.special_ids_path(SPM_FILE): (json.dumps(ids, indent=1, sort_keys=True) + "\n").encode()}

  def encode_batch(self, texts) -> list:
    return self.processor.encode(list(texts))

  def encode_offsets(self, text: str) -> tuple:
    """Byte-fallback pieces share the span of their character."""
    proto = self.processor.encode(text, return_type="proto")
    raw = text.encode("utf-8")
    # byte offset -> character offset (offsets of bytes inside a character map to that character)
    char_of = np.zeros(len(raw) + 1, np.int64)
    pos = 0
    for i, ch in enumerate(text):
      n = len(ch.encode("utf-8"))
      char_of[pos:pos + n] = i
      pos += n
    char_of[len(raw)] = len(text)
    ids, spans = [], []
    for p in proto.pieces:
      ids.append(p.id)
      spans.append([int(char_of[p.begin]), int(char_of[p.end])])
    # A zero-width piece (a leading byte of a multi-byte character) takes the next piece's end.
    for k in range(len(spans) - 2, -1, -1):
      if spans[k][1] <= spans[k][0]:
        spans[k][1] = spans[k + 1][1]
    return ids, [tuple(s) for s in spans]

  def decode(self, ids) -> str:
    return self.processor.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self.processor.id_to_piece(int(i))

  def piece_to_id(self, piece: str) -> int:
    return self.processor.piece_to_id(piece)

  def normalize(self, text: str) -> str:
    """The text as the model sees it (NFKC, collapsed whitespace): what decode() returns."""
    return self.processor.normalize(text).replace("\u2581", " ").strip()

  def word_start_table(self) -> list:
    """Per id: 1 if the piece starts a word ('▁' prefix) or is special, else 0."""
    table = [1 if self.processor.id_to_piece(i).startswith("\u2581") else 0
             for i in range(self.vocab_size)]
    for i in self.special_ids:
      table[i] = 1
    for i in range(self.vocab_size):
      if self.processor.is_control(i) or self.processor.is_unknown(i):
        table[i] = 1
    return table

  def tf_tokenize(self):
    import tensorflow as tf
    import tensorflow_text as tf_text
    return tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32).tokenize


def load(path: str) -> SentencepieceTokenizer:
  """Loads `<prefix>.model` (any path tf.io.gfile or open() reads) and its special ids."""
  try:
    proto = paths.read_bytes(path)
  except Exception as e:  # noqa: BLE001 - one clear line whatever the filesystem raised
    raise DataError(f"cannot read tokenizer model {path}: {e.__class__.__name__}") from None
  if os.path.basename(path) == FAIRSEQ_FILE:
    proto = fairseq_xlmr_to_ours(proto, path)
  processor = spm.SentencePieceProcessor()
  try:
    processor.LoadFromSerializedProto(proto)
  except Exception:  # noqa: BLE001
    raise DataError(f"{path} is not a sentencepiece model") from None
  try:
    ids = json.loads(paths.read_bytes(tokenizer_base.special_ids_path(path)).decode("utf-8"))
  except Exception:  # noqa: BLE001 - a model trained elsewhere: infer below
    ids = _infer_special_ids(processor, path)
  tok = SentencepieceTokenizer(model_path=path, layout=ids["layout"], vocab_size=processor.get_piece_size(),
                               pad_id=ids["pad_id"], bos_id=ids["bos_id"], eos_id=ids["eos_id"],
                               unk_id=ids["unk_id"], mask_id=ids["mask_id"], processor=processor,
                               raw=proto)
  for name in ("pad_id", "bos_id", "eos_id", "unk_id", "mask_id"):
    value = getattr(tok, name)
    if not 0 <= value < tok.vocab_size:
      raise DataError(f"{path}: {name}={value} is outside the vocabulary (size {tok.vocab_size})")
  return tok


def _infer_special_ids(p: spm.SentencePieceProcessor, path: str) -> dict:
  for layout, pieces in tokenizer_base.PIECES.items():
    mask = p.piece_to_id(pieces["mask"])
    if mask != p.unk_id() or pieces["mask"] == p.id_to_piece(p.unk_id()):
      return dict(layout=layout, pad_id=p.pad_id(), bos_id=p.bos_id(), eos_id=p.eos_id(),
                  unk_id=p.unk_id(), mask_id=mask)
  raise DataError(f"{path}: sentencepiece model has no <mask> or [MASK] piece and no special_ids.json")


def fairseq_xlmr_to_ours(proto_bytes: bytes, where: str = FAIRSEQ_FILE) -> bytes:
  """transformers' XLM-R sentencepiece.bpe.model (fairseq ids = sentencepiece id + 1) in our xlmr layout.

  fairseq puts <s> <pad> </s> <unk> at 0..3 and the model's own pieces from 3 on at id + 1, with
  <mask> last; rewriting the piece list in that order makes sentencepiece itself produce
  transformers' ids, with no shift anywhere else.
  """
  m = sentencepiece_model_pb2.ModelProto()
  try:
    m.ParseFromString(proto_bytes)
  except Exception:  # noqa: BLE001
    raise DataError(f"{where} is not a sentencepiece model") from None
  pieces = list(m.pieces)
  if len(pieces) < 3 or pieces[0].type != _Piece.UNKNOWN:
    raise DataError(f"{where} does not have fairseq's layout (<unk> <s> </s> first)")
  rest = [(p.piece, p.score, p.type) for p in pieces[3:]]
  del m.pieces[:]
  for piece, typ in (("<s>", _Piece.CONTROL), ("<pad>", _Piece.CONTROL), ("</s>", _Piece.CONTROL),
                     ("<unk>", _Piece.UNKNOWN)):
    m.pieces.add(piece=piece, score=0.0, type=typ)
  for piece, score, typ in rest:
    m.pieces.add(piece=piece, score=score, type=typ)
  m.pieces.add(piece="<mask>", score=0.0, type=_Piece.CONTROL)
  spec = m.trainer_spec
  spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = 0, 1, 2, 3
  spec.vocab_size = len(m.pieces)
  return m.SerializeToString()
