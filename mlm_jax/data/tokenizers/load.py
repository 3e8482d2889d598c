"""`load(path)`: the tokenizer at a path, of whichever family its files say.

A `.model`, a `tokenizer.json`, a `vocab.txt`, or a folder holding one, tried in the order spm.model,
sentencepiece.bpe.model (XLM-R's, converted to our id order), tokenizer.json, vocab.txt, vocab.json +
merges.txt. The families (spm.py, hf_tokenizers.py) import only base.py; this module imports them.
"""
from __future__ import annotations

import hashlib
import os

from mlm_jax import paths
from mlm_jax.data.tokenizers import base as tokenizer_base, hf_tokenizers, spm as tokenizer_spm
from mlm_jax.errors import DataError


def load(path: str) -> tokenizer_base.Tokenizer:
  """The tokenizer at `path`: a `.model`, `tokenizer.json`, `vocab.txt`, or a folder of one."""
  path = str(path)
  if paths.isdir(path):
    for name in (tokenizer_spm.SPM_FILE, tokenizer_spm.FAIRSEQ_FILE):
      if paths.exists(os.path.join(path, name)):
        return tokenizer_spm.load(os.path.join(path, name))
    found = hf_tokenizers.main_file_in(path)
    if found is None:
      raise DataError(f"tokenizer folder {path} holds none of {tokenizer_spm.SPM_FILE}, "
                      f"{tokenizer_spm.FAIRSEQ_FILE}, {', '.join(hf_tokenizers.MAIN_FILES)}")
    return hf_tokenizers.load(os.path.join(path, found))
  name = os.path.basename(path)
  if name.endswith(".json") or name.endswith(".txt"):
    return hf_tokenizers.load(path)
  return tokenizer_spm.load(path)


def sha256_of(path: str) -> str:
  """`load(path).sha256`, without loading a sentencepiece `.model` file (its bytes are its identity)."""
  name = os.path.basename(path)
  if not paths.isdir(path) and not (name.endswith(".json") or name.endswith(".txt")) and name != "sentencepiece.bpe.model":
    try:
      return hashlib.sha256(paths.read_bytes(path)).hexdigest()
    except OSError as e:
      raise DataError(f"cannot read tokenizer {path}: {e.strerror or e.__class__.__name__}") from None
  return load(path).sha256
