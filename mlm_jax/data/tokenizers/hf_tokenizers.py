"""WordPiece (BERT) and byte-level BPE (RoBERTa / GPT-2) tokenizers, run by Hugging Face `tokenizers`.

The library AutoTokenizer itself runs, so ids equal transformers' by construction (at the price of a
tf.numpy_function on the streaming path); read from tokenizer.json, vocab.txt or vocab.json + merges.txt
with their special tokens. Why, and the word-start rules: docs/design_notes.md#hf_tokenizers.
"""
import dataclasses
import itertools
import json
import os

import numpy as np

from mlm_jax import paths
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.errors import DataError

MAIN_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# Files read or carried along with the main one: to_hf writes back every original file.
_SIDE_FILES = {"vocab.json": ("merges.txt",), "tokenizer.json": ("vocab.txt", "vocab.json", "merges.txt")}
_SPACE = "\u0120"   # 'Ġ': byte-level BPE's encoded space
_NAMES = dict(cls=("[CLS]", "<s>"), sep=("[SEP]", "</s>"), pad=("[PAD]", "<pad>"), unk=("[UNK]", "<unk>"),
              mask=("[MASK]", "<mask>"))


def main_file_in(folder: str):
  """The file of `folder` that AutoTokenizer would read first, or None."""
  for name in MAIN_FILES:
    if paths.exists(os.path.join(folder, name)):
      return name
  return None


@dataclasses.dataclass(frozen=True)
class HFTokenizer(tokenizer_base.Tokenizer):
  """A `tokenizers.Tokenizer` (WordPiece or byte-level BPE) plus its special ids."""
  backend: object = dataclasses.field(default=None, repr=False, compare=False)
  source_files: tuple = dataclasses.field(default=(), repr=False, compare=False)  # ((name, bytes), ...)
  kind: str = "wordpiece"

  @property
  def family(self) -> str:  # noqa: D401 - overrides the class attribute per instance
    return self.kind

  @property
  def main_file(self) -> str:
    return os.path.basename(self.model_path)

  def files(self) -> dict:
    return dict(self.source_files)

  @property
  def mask_takes_left_space(self) -> bool:
    added = self.backend.get_added_tokens_decoder().get(self.mask_id)
    return bool(added is not None and added.lstrip)

  def encode_batch(self, texts) -> list:
    return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]

  def encode_words(self, words) -> list:
    """Byte-level BPE: words after the first get their leading space, as inside the sentence."""
    if self.kind == "bpe":
      words = [w if i == 0 else " " + w for i, w in enumerate(words)]
    return self.encode_batch(words)

  def encode_offsets(self, text: str) -> tuple:
    e = self.backend.encode(text, add_special_tokens=False)
    spans = [tuple(int(x) for x in o) for o in e.offsets]
    # Byte-level pieces of one character share its span; a piece whose span is empty (a trimmed
    # space) takes its neighbour's so every piece points into the text.
    for k in range(len(spans) - 2, -1, -1):
      if spans[k][1] <= spans[k][0]:
        spans[k] = (spans[k][0], spans[k + 1][1])
    return list(e.ids), spans

  def decode(self, ids) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

  def id_to_piece(self, i: int) -> str:
    return self.backend.id_to_token(int(i))

  def piece_to_id(self, piece: str) -> int:
    i = self.backend.token_to_id(piece)
    return self.unk_id if i is None else i

  def normalize(self, text: str) -> str:
    n = self.backend.normalizer
    return n.normalize_str(text) if n is not None else text

  def word_start_table(self) -> list:
    table = np.zeros(self.vocab_size, np.int32)
    space = self._space_pieces()
    for piece, i in self.backend.get_vocab(with_added_tokens=True).items():
      if i < self.vocab_size:
        if self.kind == "wordpiece":
          table[i] = not piece.startswith("##")
        else:   # whitespace-only pieces ('Ġ' of a double space) stay with the word before them
          table[i] = piece.startswith(_SPACE) and i not in space
    for i in list(self.special_ids) + list(self.backend.get_added_tokens_decoder()):
      if i < self.vocab_size:
        table[i] = 1
    return table.tolist()

  def _space_pieces(self) -> dict:
    """{id: decoded text} of the byte-level pieces that end in whitespace."""
    if self.kind != "bpe":
      return {}
    out = {}
    for piece, i in self.backend.get_vocab(with_added_tokens=False).items():
      text = self.backend.decoder.decode([piece]) if self.backend.decoder is not None else piece
      if text and text[-1].isspace():
        out[i] = text
    return out

  def after_space_table(self):
    space = self._space_pieces()
    if not space:
      return None
    table = np.zeros(self.vocab_size, np.int32)
    table[[i for i in space if i < self.vocab_size]] = 1
    return table.tolist()

  def tf_tokenize(self):
    """Tokenizes a batch of strings in one `tf.numpy_function` call (docs/design_notes.md#hf_tokenizers)."""
    import tensorflow as tf
    backend = self.backend

    def encode(batch):
      enc = backend.encode_batch_fast([b.decode("utf-8", "replace") for b in batch],
                                      add_special_tokens=False)
      lens = np.fromiter((len(e.ids) for e in enc), np.int64, len(enc))
      flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in enc), np.int32, int(lens.sum()))
      return flat, lens

    def tokenize(strings):
      flat, lens = tf.numpy_function(encode, [strings], (tf.int32, tf.int64), stateful=False)
      flat.set_shape([None])
      lens.set_shape([None])
      return tf.RaggedTensor.from_row_lengths(flat, lens, validate=False)
    return tokenize


def _read_json(path: str) -> dict:
  try:
    return json.loads(paths.read_bytes(path).decode("utf-8"))
  except FileNotFoundError:
    return {}
  except ValueError:
    raise DataError(f"{path}: not valid JSON") from None


def _token_str(value):
  if isinstance(value, dict):
    return value.get("content")
  return value


def load(path: str) -> HFTokenizer:
  """`tokenizer.json`, `vocab.txt` or `vocab.json` (with merges.txt) and the config files beside it."""
  try:
    from tokenizers import Tokenizer
  except ImportError:
    raise DataError(f"{path}: WordPiece / BPE tokenizers need the `tokenizers` package") from None
  folder, name = os.path.dirname(path), os.path.basename(path)
  try:
    raw = paths.read_bytes(path)
  except OSError as e:
    raise DataError(f"cannot read tokenizer file {path}: {e.strerror or e.__class__.__name__}") from None
  files = {name: raw}
  for side in _SIDE_FILES.get(name, ()) + CONFIG_FILES:
    p = os.path.join(folder, side)
    if paths.exists(p):
      files[side] = paths.read_bytes(p)
  config = {}
  for cfg_name in reversed(CONFIG_FILES):   # tokenizer_config.json wins over special_tokens_map.json
    if cfg_name in files:
      config.update(_read_json(os.path.join(folder, cfg_name)))
  if name.endswith(".json") and name != "vocab.json":
    try:
      backend = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions
      raise DataError(f"{path} is not a Hugging Face tokenizer.json ({str(e).splitlines()[0][:200]})") from None
    spec = json.loads(raw)
  elif name == "vocab.json":
    backend, spec = _bpe_from_vocab(folder, config), {}
  elif name.endswith(".txt"):
    backend, spec = _wordpiece_from_vocab(path, config), {}
  else:
    raise DataError(f"{path}: expected tokenizer.json, vocab.txt or vocab.json")
  model = (spec.get("model") or {}).get("type") or json.loads(backend.to_str())["model"]["type"]
  if model == "WordPiece":
    kind = "wordpiece"
  elif model == "BPE" and _byte_level(json.loads(backend.to_str())):
    kind = "bpe"
  else:
    raise DataError(f"{path}: a {model} model{' without byte-level pre-tokenization' if model == 'BPE' else ''}; "
                    "supported: WordPiece, byte-level BPE (use the sentencepiece .model for Unigram models)")
  backend.no_truncation()
  backend.no_padding()
  ids = _special_ids(backend, config, path)
  tok = HFTokenizer(model_path=path, layout=_layout(spec, backend, ids), vocab_size=backend.get_vocab_size(True),
                    backend=backend, source_files=tuple(sorted(files.items())), kind=kind, **ids)
  for key, value in ids.items():
    if not 0 <= value < tok.vocab_size:
      raise DataError(f"{path}: {key}={value} is outside the vocabulary (size {tok.vocab_size})")
  return tok


def _byte_level(spec: dict) -> bool:
  def has(node):
    if not isinstance(node, dict):
      return False
    if node.get("type") == "ByteLevel":
      return True
    return any(has(p) for p in node.get("pretokenizers", []))
  return has(spec.get("pre_tokenizer"))


def _special_ids(backend, config: dict, path: str) -> dict:
  def find(role, *keys):
    for key in keys:
      token = _token_str(config.get(key))
      if token and backend.token_to_id(token) is not None:
        return backend.token_to_id(token)
    for token in _NAMES[role]:
      if backend.token_to_id(token) is not None:
        return backend.token_to_id(token)
    raise DataError(f"{path}: no {role} token ({'/'.join(keys)} in tokenizer_config.json, or one of "
                    f"{', '.join(_NAMES[role])} in the vocabulary)")
  return dict(bos_id=find("cls", "cls_token", "bos_token"), eos_id=find("sep", "sep_token", "eos_token"),
              pad_id=find("pad", "pad_token"), unk_id=find("unk", "unk_token"), mask_id=find("mask", "mask_token"))


def _layout(spec: dict, backend, ids: dict) -> str:
  """'bert' when a pair is A [SEP] B (one separator), 'xlmr' when A </s></s> B."""
  post = spec.get("post_processor") or {}
  kind = post.get("type")
  if kind == "BertProcessing":
    return "bert"
  if kind == "RobertaProcessing":
    return "xlmr"
  if kind == "TemplateProcessing":
    pair = post.get("pair", [])
    seq = [i for i, item in enumerate(pair) if "Sequence" in item]
    if len(seq) == 2:
      return "bert" if seq[1] - seq[0] == 2 else "xlmr"
  return "bert" if backend.id_to_token(ids["bos_id"]).startswith("[") else "xlmr"


def _specials(config: dict, names: tuple) -> list:
  out = []
  for key in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token"):
    token = _token_str(config.get(key))
    if token and token not in out:
      out.append(token)
  return out or list(names)


def _wordpiece_from_vocab(path: str, config: dict):
  """A BERT tokenizer from vocab.txt, as transformers builds it from the same file and config."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
  vocab = {}
  for i, line in enumerate(paths.read_bytes(path).decode("utf-8").splitlines()):
    vocab.setdefault(line.rstrip("\n"), i)
  if not vocab:
    raise DataError(f"{path}: empty vocabulary")
  unk = _token_str(config.get("unk_token")) or "[UNK]"
  t = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
  t.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=config.get("tokenize_chinese_chars", True),
      strip_accents=config.get("strip_accents"), lowercase=config.get("do_lower_case", True))
  t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  t.decoder = decoders.WordPiece(prefix="##")
  t.add_special_tokens([s for s in _specials(config, ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")) if s in vocab])
  return t


def _bpe_from_vocab(folder: str, config: dict):
  """A byte-level BPE tokenizer from vocab.json + merges.txt (GPT-2 / RoBERTa files)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  merges = os.path.join(folder, "merges.txt")
  if not paths.exists(merges):
    raise DataError(f"{folder}: vocab.json without merges.txt")
  try:
    t = Tokenizer(models.BPE.from_file(os.path.join(folder, "vocab.json"), merges))
  except Exception as e:  # noqa: BLE001
    raise DataError(f"{folder}: cannot read vocab.json / merges.txt ({str(e).splitlines()[0][:200]})") from None
  t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=config.get("add_prefix_space", False))
  t.decoder = decoders.ByteLevel()
  t.add_special_tokens([s for s in _specials(config, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
                        if t.token_to_id(s) is not None])
  return t


def train_bpe(lines, out_dir: str, vocab_size: int) -> HFTokenizer:
  """Trains a byte-level BPE tokenizer on `lines` and saves it as a RoBERTa folder; returns it loaded.

  The folder holds what transformers' RoBERTa tokenizers read: tokenizer.json, vocab.json +
  merges.txt, tokenizer_config.json and special_tokens_map.json, with `<s> <pad> </s> <unk>` at
  ids 0-3 as RoBERTa has them and `<mask>` (lstrip, as RoBERTa's) at 4.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  t = Tokenizer(models.BPE())
  t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  t.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  t.train_from_iterator(lines, trainer)
  t.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                  add_prefix_space=False)
  t.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
  os.makedirs(out_dir, exist_ok=True)
  t.save(os.path.join(out_dir, "tokenizer.json"))
  t.model.save(out_dir)
  names = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>", cls_token="<s>",
               pad_token="<pad>", mask_token="<mask>")
  with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
    json.dump(names, f, indent=1)
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(dict(names, tokenizer_class="RobertaTokenizer", add_prefix_space=False, trim_offsets=True,
                   model_max_length=512), f, indent=1)
  return load(os.path.join(out_dir, "tokenizer.json"))
