"""Token store: the on-disk format of prepared documents, and its random-access reader.

A store is written once (prepare.py): manifest.json last, the tokenizer's files, and per source and
unit ArrayRecord shards with one document a record (no pickle) plus its token counts (.lens.npy).
The layout and the reader's options: docs/design_notes.md#shards.
"""
import dataclasses
import hashlib
import json
import os
import struct

import numpy as np
from array_record.python import array_record_module as ar

from mlm_jax import paths
from mlm_jax.errors import DataError

FORMAT_VERSION = 1
MAGIC = 0x4D4C4D44  # "DMLM"
# One record per chunk (reading a document decompresses only it), zstd: cheaper per random read of
# these small records than riegeli's default brotli (docs/design_notes.md#shards). Readers take any
# compression, so stores written with brotli stay readable.
WRITER_OPTIONS = "group_size:1,zstd:3"
# Random access, one record at a time with seek + read: the default 16 MiB readahead would read
# ahead of each record for nothing, and read([indices]) hands every call to a thread pool whose
# wake-ups cost more than the reads (docs/design_notes.md#shards).
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
READER_BUFFER = 4096
SPLITS = ("train", "eval")
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_MODEL = "spm.model"
_HEADER = np.dtype("<u4")
_HEADER_STRUCT = struct.Struct("<4I")
_ID_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def id_dtype(vocab_size: int) -> np.dtype:
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def encode_doc(ids: np.ndarray, word_starts: np.ndarray, line_ends: np.ndarray,
               dtype: np.dtype) -> bytes:
  """One document -> its record bytes (the layout: docs/design_notes.md#shards)."""
  header = np.array([MAGIC, len(ids), len(line_ends), dtype.itemsize], _HEADER)
  return b"".join((header.tobytes(), np.asarray(ids, dtype).tobytes(),
                   np.packbits(np.asarray(word_starts, np.uint8)).tobytes(),
                   np.asarray(line_ends, _HEADER).tobytes()))


def record_size(n, m, width):
  """Bytes of a record of n tokens and m lines (numbers or numpy arrays)."""
  return 16 + n * width + (n + 7) // 8 + 4 * m


@dataclasses.dataclass
class Doc:
  ids: np.ndarray          # uint16 or uint32 [n]
  word_starts: np.ndarray  # uint8 [n], 0/1
  line_ends: np.ndarray    # uint32 [m]


def decode_doc(record: bytes, where: str) -> Doc:
  """Read-only views into `record` (no copies: the batch assembly casts as it writes)."""
  magic, n, m, width = _HEADER_STRUCT.unpack_from(record) if len(record) >= 16 else (0, 0, 0, 0)
  if magic != MAGIC or width not in (2, 4) or len(record) != record_size(n, m, width):
    raise DataError(f"corrupt record in {where}: bad header {[magic, n, m, width]} for "
                    f"{len(record)} bytes (expected magic {MAGIC:#x})")
  ids = np.frombuffer(record, _ID_DTYPES[width], n, 16)
  off = 16 + n * width
  ws = np.unpackbits(np.frombuffer(record, np.uint8, (n + 7) // 8, off), count=n)
  ends = np.frombuffer(record, _HEADER, m, off + (n + 7) // 8)
  return Doc(ids, ws, ends)


@dataclasses.dataclass(frozen=True)
class Joined:
  """Several documents' records back to back in one buffer, so that one numpy gather reads tokens
  of many documents at once (the batch assembly's path: a Python step per document or piece cost
  more than reading the records)."""
  buf: np.ndarray        # uint8, the records back to back
  ids_at: np.ndarray     # int64 [k]: byte offset of each document's ids
  bits_at: np.ndarray    # int64 [k]: byte offset of its packed word-start flags
  lengths: np.ndarray    # int64 [k]: tokens
  width: int             # bytes per token id (2 or 4), little-endian

  def ids(self, doc: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Token t of document doc (arrays of equal shape; 0 <= t < lengths[doc])."""
    at = self.ids_at[doc] + t * self.width
    out = self.buf[at].astype(np.int32)
    for k in range(1, self.width):
      out |= self.buf[at + k].astype(np.int32) << (8 * k)
    return out

  def word_starts(self, doc: np.ndarray, t: np.ndarray) -> np.ndarray:
    return (self.buf[self.bits_at[doc] + t // 8] >> (7 - t % 8).astype(np.uint8)) & 1


def join_records(records: list, where: list) -> Joined:
  """Records (bytes) -> Joined, checking every header as decode_doc does; where[i] names record
  i's shard in errors."""
  buf = np.frombuffer(b"".join(records), np.uint8)
  size = np.fromiter(map(len, records), np.int64, len(records))
  at = np.cumsum(size) - size
  if not records:
    return Joined(buf, at, at, at, 2)
  head = buf[np.minimum(at[:, None] + np.arange(16), buf.size - 1)].view(_HEADER)
  magic, n, m, width = (head[:, i].astype(np.int64) for i in range(4))
  ok = (magic == MAGIC) & ((width == 2) | (width == 4)) & (size >= 16)
  ok &= size == record_size(n, m, width)
  ok &= width == width[0]
  if not ok.all():
    i = int(np.argmin(ok))
    raise DataError(f"corrupt record in {where[i]}: bad header {head[i].tolist()} for {size[i]} bytes "
                    f"(expected magic {MAGIC:#x}, {int(width[0])}-byte ids as the batch's first record)")
  w = int(width[0])
  return Joined(buf, at + 16, at + 16 + n * w, n, w)


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def unit_stem(root: str, source: str, unit: int) -> str:
  return os.path.join(root, "data", source, f"{unit:06d}")


def parse_store_spec(spec: str):
  """'store:DIR[:SRC,SRC]' -> (DIR, [SRC] or None)."""
  body = spec[len("store:"):]
  if not body:
    raise DataError(f"bad store spec {spec!r}: expected store:DIR[:SOURCE,...]")
  path, _, names = body.partition(":") if not body.startswith("gs://") else (body, "", "")
  return path, ([n for n in names.split(",") if n] or None)


def check_local(root: str) -> None:
  """Stores are local (or mounted) directories: ArrayRecord's open-source reader and writer use
  file descriptors, so a gs:// path would not be read; say so instead of failing on a missing file."""
  if paths.is_remote(root):
    raise DataError(f"token store {root}: a store must be a local or mounted directory (ArrayRecord "
                    "reads files by descriptor); copy it to local disk or mount the bucket (gcsfuse) "
                    "and give that path")


class Store:
  """A prepared store, opened read-only: manifest, document lengths, documents by id.

  Documents of a (source, split) are numbered 0..n-1 in unit order, then record order.
  """

  def __init__(self, root: str):
    check_local(root)
    self.root = root
    path = os.path.join(root, MANIFEST)
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except OSError as e:
      raise DataError(f"cannot read token store {root}: no {MANIFEST} ({e.strerror}); "
                      "run tools/prepare_data.py first (it writes the manifest last)") from None
    try:
      self.manifest = json.loads(raw)
    except ValueError:
      raise DataError(f"corrupt {path}: not JSON") from None
    version = self.manifest.get("format_version")
    if version != FORMAT_VERSION:
      raise DataError(f"{path}: format_version={version!r}, this mlm_jax reads {FORMAT_VERSION}")
    self.fingerprint = hashlib.sha256(raw).hexdigest()[:16]
    self.sources = self.manifest["sources"]
    self._lens = {}
    self._offsets = {}
    self._readers = {}

  @property
  def tokenizer_path(self) -> str:
    """The tokenizer's main file inside the store (`tokenizers.load.load` takes it)."""
    model = self.manifest["tokenizer"].get("model", f"{TOKENIZER_DIR}/{TOKENIZER_MODEL}")
    return os.path.join(self.root, model)

  def check_tokenizer(self, model_path: str) -> None:
    """A `data.tokenizer` given beside a store must be the store's own (same sha256)."""
    from mlm_jax.data.tokenizers import load as tokenizer_load
    want = self.manifest["tokenizer"]["sha256"]
    if paths.missing(model_path):
      raise DataError(f"cannot read data.tokenizer {model_path}: no such file or folder")
    got = tokenizer_load.sha256_of(model_path)
    if got != want:
      raise DataError(f"data.tokenizer {model_path} (sha256 {got[:16]}) is not the tokenizer of "
                      f"store {self.root} (sha256 {want[:16]}); leave data.tokenizer empty")

  def source(self, name: str) -> dict:
    if name not in self.sources:
      raise DataError(f"store {self.root} has no source {name!r}; it has {sorted(self.sources)}")
    return self.sources[name]

  def lengths(self, name: str, split: str) -> np.ndarray:
    """Token counts of every document of (source, split), int32, in document-id order."""
    key = (name, split)
    if key not in self._lens:
      parts = []
      for unit in self.source(name)["units"]:
        path = unit_stem(self.root, name, unit["unit"]) + ".lens.npy"
        try:
          lens = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as e:
          raise DataError(f"cannot read {path}: {e}") from None
        if len(lens) != unit["train_docs"] + unit["eval_docs"]:
          raise DataError(f"corrupt {path}: {len(lens)} lengths, manifest says "
                          f"{unit['train_docs'] + unit['eval_docs']}")
        parts.append(lens[:unit["train_docs"]] if split == "train" else lens[unit["train_docs"]:])
      self._lens[key] = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
      counts = [u[f"{split}_docs"] for u in self.source(name)["units"]]
      self._offsets[key] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return self._lens[key]

  def _reader(self, name: str, split: str, unit_pos: int):
    """(reader, path) of a shard, opened and checked against the manifest once."""
    key = (name, split, unit_pos)
    if key not in self._readers:
      unit = self.source(name)["units"][unit_pos]
      path = unit_stem(self.root, name, unit["unit"]) + f".{split}.arrayrecord"
      expected = unit["files"][f"{split}.arrayrecord"]["bytes"]
      try:
        size = os.path.getsize(path)
      except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror}") from None
      if size != expected:
        raise DataError(f"shard {path} is {size} bytes, the manifest says {expected}: "
                        "truncated or replaced; re-run prepare_data.py for it")
      try:
        reader = ar.ArrayRecordReader(path, READER_OPTIONS, file_reader_buffer_size=READER_BUFFER)
      except Exception as e:  # noqa: BLE001 - riegeli raises RuntimeError/ValueError
        raise DataError(f"cannot open shard {path}: {_first_line(e)}") from None
      if reader.num_records() != unit[f"{split}_docs"]:
        raise DataError(f"shard {path} has {reader.num_records()} records, the manifest says "
                        f"{unit[f'{split}_docs']}")
      self._readers[key] = (reader, path)
    return self._readers[key]

  def _records(self, name: str, split: str, doc_ids) -> tuple[list, list]:
    """(record bytes, shard path of each), in the order asked."""
    self.lengths(name, split)
    offsets = self._offsets[(name, split)]
    doc_ids = np.asarray(doc_ids, np.int64)
    units = np.searchsorted(offsets, doc_ids, side="right") - 1
    out, paths = [None] * len(doc_ids), [None] * len(doc_ids)
    for u in np.unique(units).tolist():
      where = np.nonzero(units == u)[0].tolist()
      reader, path = self._reader(name, split, u)
      try:
        for i, k in zip(where, (doc_ids[where] - offsets[u]).tolist()):
          reader.seek(k)
          out[i] = reader.read()
      except Exception as e:  # noqa: BLE001
        raise DataError(f"cannot read shard {path}: {_first_line(e)}") from None
      for i in where:
        paths[i] = path
    return out, paths

  def read(self, name: str, split: str, doc_ids) -> list:
    """Documents by id (any order, repeats allowed) -> [Doc], in the order asked."""
    return [decode_doc(r, p) for r, p in zip(*self._records(name, split, doc_ids))]

  def read_joined(self, name: str, split: str, doc_ids) -> Joined:
    """Documents by id -> one Joined buffer (document i of it = doc_ids[i])."""
    return join_records(*self._records(name, split, doc_ids))

  def close(self):
    for reader, _ in self._readers.values():
      reader.close()
    self._readers = {}


def _first_line(e) -> str:
  s = str(e).strip()
  return s.splitlines()[0] if s else e.__class__.__name__
