"""Our sentencepiece tokenizer as Hugging Face tokenizer files that give exactly our ids.

The model is described to `tokenizers` as tokenizer.json (pieces and scores in our id order, its
normalizer, byte fallback), special tokens as added tokens; spm.model is copied beside it so `from_hf`
brings it back unchanged. Why not transformers' own classes: docs/design_notes.md#tokenizer_files.
"""
from __future__ import annotations

import json
import os
import shutil

from sentencepiece import sentencepiece_model_pb2

from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.errors import ConversionError

# Copied next to the HF files; the name is not one that transformers' classes look for.
SPM_FILE = "spm.model"
_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
# Pieces that sentencepiece never produces from text; they must not win a segmentation here either.
_NEVER_FROM_TEXT = -1e9
_NFKC_RULES = ("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf")


def _proto(tok: tokenizer_base.Tokenizer) -> sentencepiece_model_pb2.ModelProto:
  m = sentencepiece_model_pb2.ModelProto()
  m.ParseFromString(tok.model_proto)
  return m


def _special_tokens(tok: tokenizer_base.Tokenizer) -> dict:
  """HF role -> piece string, from our ids (CLS/SEP are BOS/EOS in both layouts)."""
  piece = tok.id_to_piece
  return dict(bos_token=piece(tok.bos_id), eos_token=piece(tok.eos_id), unk_token=piece(tok.unk_id),
              pad_token=piece(tok.pad_id), mask_token=piece(tok.mask_id), cls_token=piece(tok.bos_id),
              sep_token=piece(tok.eos_id))


def _unigram(proto, unk_id: int, byte_fallback: bool):
  from tokenizers import models
  vocab = []
  for p in proto.pieces:
    normal = p.type in (_Piece.NORMAL, _Piece.USER_DEFINED)
    vocab.append((p.piece, p.score if normal else _NEVER_FROM_TEXT))
  return models.Unigram(vocab, unk_id=unk_id, byte_fallback=byte_fallback)


def _bpe(proto, unk_piece: str, byte_fallback: bool):
  """sentencepiece BPE merges the adjacent pair whose result has the highest score; ranking every
  (left, right) split of a piece by that piece's score gives the same order of merges."""
  from tokenizers import models
  vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  normal = [(i, p) for i, p in enumerate(proto.pieces) if p.type == _Piece.NORMAL]
  merges = []
  for i, p in normal:
    s = p.piece
    for cut in range(1, len(s)):
      left, right = s[:cut], s[cut:]
      if left in vocab and right in vocab:
        merges.append((-p.score, i, vocab[left], vocab[right], left, right))
  merges.sort()
  return models.BPE(vocab=vocab, merges=[(m[4], m[5]) for m in merges], unk_token=unk_piece,
                    fuse_unk=True, byte_fallback=byte_fallback)


def build(tok: tokenizer_base.Tokenizer):
  """A `tokenizers.Tokenizer` that encodes text to our ids (BOS ... EOS added as ours are)."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
  proto = _proto(tok)
  spec, ns = proto.trainer_spec, proto.normalizer_spec
  if spec.treat_whitespace_as_suffix or not ns.escape_whitespaces:
    raise ConversionError(f"{tok.model_path}: sentencepiece models with treat_whitespace_as_suffix or without "
                          "escaped whitespace are not supported for Hugging Face export")
  unk_piece = tok.id_to_piece(tok.unk_id)
  if spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    model = _unigram(proto, tok.unk_id, spec.byte_fallback)
  elif spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE:
    model = _bpe(proto, unk_piece, spec.byte_fallback)
  else:
    raise ConversionError(f"{tok.model_path}: sentencepiece model type {spec.model_type} (word/char) is not "
                          "supported for Hugging Face export: expected unigram or bpe")
  t = Tokenizer(model)

  steps = []
  if ns.precompiled_charsmap:
    # sentencepiece matches its character map on the longest multi-character sequence (half-width
    # 'ﾍﾟ' -> 'ペ'); tokenizers' Precompiled does not always, so for the NFKC-based rules we compose
    # first - the map of NFKC text is the map of the text.
    if ns.name in _NFKC_RULES:
      steps.append(normalizers.NFKC())
    steps.append(normalizers.Precompiled(ns.precompiled_charsmap))
  if ns.remove_extra_whitespaces:
    steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True)]
  if steps:
    t.normalizer = normalizers.Sequence(steps)
  t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                             prepend_scheme="always" if ns.add_dummy_prefix else "never",
                                             split=bool(spec.split_by_whitespace))
  t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                 decoders.Strip(" ", 1, 0)])

  sp = _special_tokens(tok)
  # Every control/unknown piece of the model (not only the five roles) is an added special token,
  # in id order, so that none of them is ever produced from ordinary text.
  specials = [p.piece for p in proto.pieces if p.type in (_Piece.CONTROL, _Piece.UNKNOWN)]
  t.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=(s == sp["mask_token"]))
                        for s in specials])
  bos, eos = sp["bos_token"], sp["eos_token"]
  if tok.layout == "bert":
    pair = f"{bos} $A:0 {eos}:0 $B:1 {eos}:1"
  else:  # RoBERTa / XLM-R: <s> A </s></s> B </s>
    pair = f"{bos} $A {eos} {eos} $B {eos}"
  t.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A {eos}", pair=pair, special_tokens=[(bos, tok.bos_id), (eos, tok.eos_id)])
  return t


def write(tok: tokenizer_base.Tokenizer, out_dir: str, model_max_length: int) -> list[str]:
  """Writes tokenizer.json, tokenizer_config.json, special_tokens_map.json and the .model; returns names."""
  t = build(tok)
  t.save(os.path.join(out_dir, "tokenizer.json"))
  sp = _special_tokens(tok)
  config = dict(sp, tokenizer_class="PreTrainedTokenizerFast", model_max_length=int(model_max_length),
                clean_up_tokenization_spaces=False, model_input_names=["input_ids", "attention_mask"])
  if tok.layout == "bert":
    config["model_input_names"].append("token_type_ids")
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2, ensure_ascii=False)
  with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
    json.dump(sp, f, indent=2, ensure_ascii=False)
  with open(os.path.join(out_dir, SPM_FILE), "wb") as f:
    f.write(tok.model_proto)
  ids_src = tokenizer_base.special_ids_path(tok.model_path)
  ids_dst = tokenizer_base.special_ids_path(os.path.join(out_dir, SPM_FILE))
  if os.path.exists(ids_src):
    shutil.copyfile(ids_src, ids_dst)
  else:
    with open(ids_dst, "w", encoding="utf-8") as f:
      json.dump(dict(layout=tok.layout, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id,
                     unk_id=tok.unk_id, mask_id=tok.mask_id), f, indent=1, sort_keys=True)
  return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", SPM_FILE,
          os.path.basename(ids_dst)]
