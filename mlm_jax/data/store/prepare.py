"""Prepare once: text sources -> token store (the format: shards.py).

Work units depend only on the sources, and each unit's files only on its input and the options, so the
store's bytes do not depend on the workers or on what ran them (this module's process pool, or a Beam
runner: beam_pipeline.py), and a killed run re-run gives the same bytes; the manifest is written last.
How: docs/design_notes.md#prepare.
"""
import dataclasses
import glob
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from typing import Callable, Optional, Sequence

import numpy as np
from array_record.python import array_record_module as ar

from mlm_jax import paths
from mlm_jax.data import specs
from mlm_jax.data.specs import list_files, parse_named
from mlm_jax.data.store import shards
from mlm_jax.data.store import text_reader
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.errors import DataError

TFDS_UNITS = 16
_BATCH = 256  # documents per tokenizer call
DEFAULT_MAX_LINE_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything that decides the store's bytes (pinned in prepare.json)."""
  sources: tuple
  tokenizer: str
  doc_format: str = "line"
  eval_percent: float = 1.0
  max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
  tfds_data_dir: str = ""
  strict: bool = False

  def key(self, tokenizer_sha256: str, family: str = "") -> dict:
    key = dict(format_version=shards.FORMAT_VERSION, sources=list(self.sources),
               tokenizer_sha256=tokenizer_sha256, doc_format=self.doc_format,
               eval_percent=self.eval_percent, max_line_bytes=self.max_line_bytes,
               tfds_units=TFDS_UNITS)
    if family == "bpe":   # pinned: a prepare begun before this encoding cannot be finished with it
      key["later_lines"] = "space_prefixed"
    return key


@dataclasses.dataclass(frozen=True)
class Unit:
  source: str   # source name
  index: int    # unit number within the source
  kind: str     # text | tsv | jsonl | tfds | tfrecord
  input: str    # file path, or TFDS NAME:SPLIT_SLICE:FEATURE
  arg: str = ""
  size: int = 1  # input bytes (progress / ETA)


def plan(opts: Options) -> list:
  """All units of all sources, in a fixed order."""
  if opts.doc_format not in ("line", "blank_line"):
    raise DataError(f"doc_format={opts.doc_format!r}: expected 'line' or 'blank_line'")
  units = []
  for src in parse_named(opts.sources):
    if src.spec.kind == "tfds":
      split, feature = src.spec.arg.split(":")
      for k in range(TFDS_UNITS):
        part = f"{split}[{k * 100 // TFDS_UNITS}%:{(k + 1) * 100 // TFDS_UNITS}%]"
        units.append(Unit(src.name, k, "tfds", f"{src.spec.pattern}:{part}:{feature}"))
      continue
    for k, path in enumerate(list_files(src.spec.pattern, src.owner)):
      units.append(Unit(src.name, k, src.spec.kind, path, src.spec.arg, _size(path)))
  if not units:
    raise DataError("no sources given to prepare")
  return units


def _size(path):
  return paths.local_size(path)


# ------------------------------------------------------------------------------------------
# One unit
# ------------------------------------------------------------------------------------------
class Encoder:
  """Tokenizer-derived constants of a worker, and the held-out hash."""

  def __init__(self, tok: tokenizer_base.Tokenizer, eval_percent: float):
    self.tok = tok
    self.table = np.asarray(tok.word_start_table(), np.int32)
    after = tok.after_space_table()
    self.after_space = None if after is None else np.asarray(after, np.int32)
    self.dtype = shards.id_dtype(tok.vocab_size)
    self.eval_buckets = int(round(eval_percent * 100))
    # Byte-level BPE marks a word after a space ('Ġ'), and the streaming path joins a document's
    # lines with spaces: a later line is encoded as ' ' + line so that both paths give the same ids.
    # (sentencepiece and WordPiece give the same ids either way.)
    self.space_lines = tok.family == "bpe"

  def in_eval(self, keys: Sequence) -> np.ndarray:
    if self.eval_buckets <= 0 or not keys:
      return np.zeros(len(keys), bool)
    import tensorflow as tf  # FarmHash, exactly as the streaming path's `_holdout_keep`
    return tf.strings.to_hash_bucket_fast(list(keys), 10000).numpy() < self.eval_buckets

  def records(self, docs: list) -> list:
    """[[line, ...]] -> [(record bytes, n_tokens) or None for a document without tokens]."""
    flat = [" " + line if j and self.space_lines else line for d in docs for j, line in enumerate(d)]
    ids = self.tok.encode_batch(flat)
    out, i = [], 0
    for d in docs:
      parts = ids[i:i + len(d)]
      i += len(d)
      out.append(self.record_of(parts))
    return out

  def record_of(self, parts: list):
    toks = np.fromiter(itertools.chain.from_iterable(parts), np.int64)
    if toks.size == 0:
      return None
    ws = self.table[toks]
    if self.after_space is not None:
      ws[1:] = np.maximum(ws[1:], self.after_space[toks[:-1]])
    ends = np.cumsum([len(p) for p in parts])
    ws[0] = 1
    ws[ends[:-1][ends[:-1] < toks.size]] = 1   # each line starts a word (RoBERTa's first has no 'Ġ')
    return shards.encode_doc(toks, ws, ends, self.dtype), int(toks.size)


def _documents(unit: Unit, opts: Options, counters):
  """(hash key, [line] or token ids) of the unit's documents, in input order."""
  if unit.kind in specs.TEXT_KINDS:
    for doc in text_reader.documents(unit.input, specs.text_field(unit.kind, unit.arg), opts.doc_format,
                                     opts.max_line_bytes, counters):
      yield " ".join(doc), doc
  elif unit.kind == "tfrecord":
    from mlm_jax.data.text.sources import numpy_elements, tf
    gz = unit.input.endswith(".gz")
    for rec in numpy_elements(tf.data.TFRecordDataset(unit.input, "GZIP" if gz else "")):
      ex = tf.train.Example.FromString(rec)
      yield rec, np.asarray(ex.features.feature["input_ids"].int64_list.value, np.int64)
  else:
    import tensorflow_datasets as tfds
    from mlm_jax.data.text.sources import as_written, numpy_elements
    name, rest = unit.input.split(":", 1)
    part, feature = rest.rsplit(":", 1)   # the split slice has a colon of its own: train[0%:6%]
    ds = tfds.builder(name, data_dir=opts.tfds_data_dir or None).as_dataset(split=part)
    for raw in numpy_elements(ds.map(as_written(lambda ex: ex[feature]))):   # the text feature alone: scalars batch
      text = raw.decode("utf-8", errors="replace").lstrip("\ufeff").replace("\r", "")
      doc = [line for line in text.split("\n") if line.strip()]
      if doc:
        yield " ".join(doc), doc


def _fsync_replace(tmp: str, path: str) -> None:
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _tmp(path: str) -> str:
  """A temporary name beside `path`, never shared: a unit may be run twice at once (a runner's
  retry or backup task, on another host of a shared filesystem, where process ids repeat)."""
  return f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _write_atomic(path: str, write: Callable[[str], None]) -> None:
  tmp = _tmp(path)
  write(tmp)
  _fsync_replace(tmp, path)


def _put(path: str, data: bytes) -> None:
  """Writes a whole small file: atomically on a local path; an object store's object appears whole."""
  if paths.is_remote(path):
    with paths.open_file(path, "wb") as f:
      f.write(data)
  else:
    _write_atomic(path, lambda t: _write_bytes(t, data))


def _json_bytes(obj) -> bytes:
  return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8")


def in_unit(unit: Unit, message: str) -> str:
  """`message` of a failure while preparing `unit`, naming the source, the unit and its input."""
  where = "" if unit.input in message else f" ({unit.input})"
  return f"cannot prepare source {unit.source!r} unit {unit.index}{where}: {message}"


def run_unit(root: str, unit: Unit, opts: Options, enc: Encoder, progress=None) -> dict:
  """Tokenizes one unit and writes its shards, lengths and done marker (last); returns the marker.

  A remote root (gs://...) gets the files written in a local temporary folder, then copied up. A
  DataError names the source, the unit and its input.
  """
  try:
    if not paths.is_remote(root):
      return _run_unit(root, unit, opts, enc, progress)
    with tempfile.TemporaryDirectory(prefix="mlm_jax_unit_") as local:
      marker = _run_unit(local, unit, opts, enc, progress)
      src, dst = (shards.unit_stem(r, unit.source, unit.index) for r in (local, root))
      paths.makedirs(os.path.dirname(dst))
      for name in sorted(marker["files"]) + ["json"]:
        paths.copy_file(f"{src}.{name}", f"{dst}.{name}")
      return marker
  except DataError as e:
    raise DataError(in_unit(unit, str(e))) from None


def _run_unit(root: str, unit: Unit, opts: Options, enc: Encoder, progress) -> dict:
  stem = shards.unit_stem(root, unit.source, unit.index)
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  counters = text_reader.Counters(strict=opts.strict)
  lens = {"train": [], "eval": []}
  tmp = {s: _tmp(f"{stem}.{s}.arrayrecord") for s in shards.SPLITS}
  writers = {s: ar.ArrayRecordWriter(tmp[s], shards.WRITER_OPTIONS) for s in shards.SPLITS}
  try:
    batch = []
    for item in _documents(unit, opts, counters):
      batch.append(item)
      if len(batch) == _BATCH:
        _write_batch(batch, enc, writers, lens, counters, unit, progress)
        batch = []
    _write_batch(batch, enc, writers, lens, counters, unit, progress)
  finally:
    for w in writers.values():
      w.close()
  files = {}
  for s in shards.SPLITS:
    _fsync_replace(tmp[s], f"{stem}.{s}.arrayrecord")
  all_lens = np.asarray(lens["train"] + lens["eval"], np.int32)
  _write_atomic(stem + ".lens.npy", lambda t: _save_npy(t, all_lens))
  for name in [f"{s}.arrayrecord" for s in shards.SPLITS] + ["lens.npy"]:
    path = f"{stem}.{name}"
    files[name] = dict(bytes=os.path.getsize(path), sha256=shards.sha256_file(path))
  marker = dict(unit=unit.index, input=unit.input, train_docs=len(lens["train"]),
                eval_docs=len(lens["eval"]), train_tokens=int(sum(lens["train"])),
                eval_tokens=int(sum(lens["eval"])), stats=dict(counters), files=files)
  _put(stem + ".json", _json_bytes(marker))
  return marker


def _write_bytes(path, data):
  with open(path, "wb") as f:
    f.write(data)


def _save_npy(path, array):
  with open(path, "wb") as f:
    np.save(f, array)


def _write_batch(batch, enc, writers, lens, counters, unit, progress):
  if not batch:
    return
  keys = [k for k, _ in batch]
  held = enc.in_eval(keys)
  if unit.kind == "tfrecord":
    recs = [enc.record_of([d.tolist()]) for _, d in batch]
  else:
    recs = enc.records([d for _, d in batch])
  docs = tokens = 0
  for rec, h in zip(recs, held):
    if rec is None:
      counters.add("empty_docs", unit.input)
      continue
    split = "eval" if h else "train"
    writers[split].write(rec[0])
    lens[split].append(rec[1])
    docs += 1
    tokens += rec[1]
  if progress is not None:
    progress(docs, tokens)


# ------------------------------------------------------------------------------------------
# Workers, manifest
# ------------------------------------------------------------------------------------------
_WORKER = {}


def _init_worker(opts: Options, docs, tokens):
  logging.getLogger().setLevel(logging.WARNING)
  _WORKER.update(enc=Encoder(tokenizer_load.load(opts.tokenizer), opts.eval_percent),
                 opts=opts, docs=docs, tokens=tokens)


def _count(d, t):
  with _WORKER["docs"].get_lock():
    _WORKER["docs"].value += d
    _WORKER["tokens"].value += t


def _run_in_worker(args):
  root, unit = args
  return unit, run_unit(root, unit, _WORKER["opts"], _WORKER["enc"], _count)


def _marker(root: str, unit: Unit) -> str:
  return shards.unit_stem(root, unit.source, unit.index) + ".json"


def read_marker(root: str, unit: Unit) -> Optional[dict]:
  """The done marker of a finished unit, None for a unit still to prepare."""
  path = _marker(root, unit)
  return json.loads(paths.read_bytes(path)) if paths.exists(path) else None


def pin_options(root: str, opts: Options, tok: tokenizer_base.Tokenizer) -> str:
  """Copies the tokenizer's files into the store and pins the options; returns the tokenizer sha256."""
  tok_dir = os.path.join(root, shards.TOKENIZER_DIR)
  paths.makedirs(tok_dir)
  for name, data in tok.files().items():
    path = os.path.join(tok_dir, name)
    if not paths.exists(path):
      _put(path, data)
  sha = tok.sha256
  key = opts.key(sha, tok.family)
  pinned = os.path.join(root, "prepare.json")
  if not paths.exists(pinned):
    _put(pinned, _json_bytes(key))
  old = json.loads(paths.read_bytes(pinned))
  changed = [k for k in key if old.get(k) != key[k]]
  if changed:
    raise DataError(f"{root} was prepared with other options ({', '.join(changed)} differ, see "
                    f"{pinned}): use a new --out directory")
  return sha


def prepare(opts: Options, root: str, *, num_workers: int = 1, progress_s: float = 10.0,
            log: Optional[Callable[[str], None]] = None) -> dict:
  """Prepares every unit not done yet in `num_workers` processes, then writes the manifest; returns it.

  `root` may be remote (gs://...): the store is then read from a local copy or a mount (shards.py).
  """
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  tok = tokenizer_load.load(opts.tokenizer)
  sha = pin_options(root, opts, tok)
  units = plan(opts)
  _run_units(root, opts, [u for u in units if not paths.exists(_marker(root, u))], num_workers,
             progress_s, log)
  return write_manifest(root, opts, tok, sha, units)


def _run_units(root, opts, units, num_workers, progress_s, log):
  total = sum(u.size for u in units)
  done_bytes, t0, last = 0, time.time(), [time.time()]
  ctx = multiprocessing.get_context("spawn")
  docs, tokens = ctx.Value("q", 0), ctx.Value("q", 0)

  def report(force=False):
    now = time.time()
    if not force and now - last[0] < progress_s:
      return
    last[0] = now
    dt = max(now - t0, 1e-9)
    eta = dt / done_bytes * (total - done_bytes) if done_bytes else float("nan")
    log(f"[prepare] {done_bytes / max(total, 1):.0%} of {len(units)} units: {docs.value} docs, "
        f"{tokens.value} tokens, {tokens.value / dt:,.0f} tokens/s, ETA {eta:,.0f}s")

  if num_workers <= 1:
    _init_worker(opts, docs, tokens)
    results = (_run_in_worker((root, u)) for u in units)
  else:
    pool = ctx.Pool(num_workers, initializer=_init_worker, initargs=(opts, docs, tokens))
    results = pool.imap_unordered(_run_in_worker, [(root, u) for u in units])
  try:
    for unit, _ in results:
      done_bytes += unit.size
      report()
  finally:
    if num_workers > 1:
      pool.terminate()
  report(force=True)


def write_manifest(root: str, opts: Options, tok: tokenizer_base.Tokenizer, sha: str, units: list,
                   markers: Optional[list] = None) -> dict:
  """Writes manifest.json from the units' done markers (read from the store unless given, in the
  order of `units`), once every unit is done; removes the temporaries a killed run left."""
  if markers is None:
    markers = [read_marker(root, u) for u in units]
  missing = [u for u, m in zip(units, markers) if m is None]
  if missing:
    raise DataError(f"cannot write the manifest of {root}: {len(missing)} units not prepared, first "
                    f"{missing[0].source} unit {missing[0].index} ({missing[0].input})")
  sources = {}
  for u, marker in zip(units, markers):
    src = sources.setdefault(u.source, dict(documents=0, tokens=0, eval_documents=0,
                                            eval_tokens=0, shards=0, units=[],
                                            stats={k: 0 for k in text_reader.REPAIRS}))
    src["documents"] += marker["train_docs"]
    src["tokens"] += marker["train_tokens"]
    src["eval_documents"] += marker["eval_docs"]
    src["eval_tokens"] += marker["eval_tokens"]
    src["shards"] += len(shards.SPLITS)
    for k, v in marker["stats"].items():
      src["stats"][k] += v
    src["units"].append(marker)
  for src in parse_named(opts.sources):
    if src.name in sources:
      sources[src.name]["spec"] = src.spec_str
  tok_dir = os.path.join(root, shards.TOKENIZER_DIR)
  tok_files = {n: hashlib.sha256(paths.read_bytes(os.path.join(tok_dir, n))).hexdigest()
               for n in paths.listdir(tok_dir) if ".tmp-" not in n}
  manifest = dict(
      format_version=shards.FORMAT_VERSION, options=opts.key(sha, tok.family),
      tokenizer=dict(model=f"{shards.TOKENIZER_DIR}/{tok.main_file}", sha256=sha, family=tok.family,
                     files=tok_files, vocab_size=tok.vocab_size, layout=tok.layout,
                     pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id, unk_id=tok.unk_id,
                     mask_id=tok.mask_id, id_dtype=shards.id_dtype(tok.vocab_size).name),
      sources=sources)
  if not paths.is_remote(root):   # every unit is done: a temporary left is a killed run's
    for stale in glob.glob(os.path.join(glob.escape(root), "**", "*.tmp-*"), recursive=True):
      os.remove(stale)
  path = os.path.join(root, shards.MANIFEST)
  data = _json_bytes(manifest)
  if not paths.exists(path) or paths.read_bytes(path) != data:
    _put(path, data)
  return manifest
