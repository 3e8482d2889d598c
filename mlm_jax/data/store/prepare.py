"""Prepare once: text sources -> token store (the format: shards.py).

Work units depend only on the sources, and each unit's files only on its input and the options, so the
store's bytes do not depend on workers or tasks and a killed run re-run gives the same bytes; the
manifest is written last. How: docs/design_notes.md#prepare.
"""
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np
from array_record.python import array_record_module as ar

from mlm_jax import paths
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
  kind: str     # text | tsv | tfds | tfrecord
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
class _Encoder:
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
  if unit.kind in ("text", "tsv"):
    field = int(unit.arg) if unit.kind == "tsv" else -1
    for doc in text_reader.documents(unit.input, field, opts.doc_format, opts.max_line_bytes,
                                     counters):
      yield " ".join(doc), doc
  elif unit.kind == "tfrecord":
    import tensorflow as tf
    gz = unit.input.endswith(".gz")
    for rec in tf.data.TFRecordDataset(unit.input, "GZIP" if gz else "").as_numpy_iterator():
      ex = tf.train.Example.FromString(rec)
      yield rec, np.asarray(ex.features.feature["input_ids"].int64_list.value, np.int64)
  else:
    import tensorflow_datasets as tfds
    name, rest = unit.input.split(":", 1)
    part, feature = rest.rsplit(":", 1)   # the split slice has a colon of its own: train[0%:6%]
    ds = tfds.builder(name, data_dir=opts.tfds_data_dir or None).as_dataset(split=part)
    for ex in ds.as_numpy_iterator():
      text = ex[feature].decode("utf-8", errors="replace").lstrip("\ufeff").replace("\r", "")
      doc = [line for line in text.split("\n") if line.strip()]
      if doc:
        yield " ".join(doc), doc


def _fsync_replace(tmp: str, path: str) -> None:
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _write_atomic(path: str, write: Callable[[str], None]) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  write(tmp)
  _fsync_replace(tmp, path)


def run_unit(root: str, unit: Unit, opts: Options, enc: _Encoder, progress=None) -> dict:
  """Tokenizes one unit and writes its shards, lengths and done marker; returns the marker."""
  stem = shards.unit_stem(root, unit.source, unit.index)
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  counters = text_reader.Counters(strict=opts.strict)
  lens = {"train": [], "eval": []}
  tmp = {s: f"{stem}.{s}.arrayrecord.tmp-{os.getpid()}" for s in shards.SPLITS}
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
  _write_atomic(stem + ".json", lambda t: _write_json(t, marker))
  return marker


def _write_bytes(path, data):
  with open(path, "wb") as f:
    f.write(data)


def _save_npy(path, array):
  with open(path, "wb") as f:
    np.save(f, array)


def _write_json(path, obj):
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _write_batch(batch, enc, writers, lens, counters, unit, progress):
  if not batch:
    return
  keys = [k for k, _ in batch]
  held = enc.in_eval(keys)
  if unit.kind == "tfrecord":
    recs = [enc.record_of([d.tolist()]) for _, d in batch]
  else:
    recs = enc.records([d for _, d in batch])
  tokens = 0
  for rec, h in zip(recs, held):
    if rec is None:
      counters.add("empty_docs", unit.input)
      continue
    split = "eval" if h else "train"
    writers[split].write(rec[0])
    lens[split].append(rec[1])
    tokens += rec[1]
  if progress is not None:
    progress(len(batch), tokens)


# ------------------------------------------------------------------------------------------
# Workers, tasks, manifest
# ------------------------------------------------------------------------------------------
_WORKER = {}


def _init_worker(opts: Options, docs, tokens):
  logging.getLogger().setLevel(logging.WARNING)
  _WORKER.update(enc=_Encoder(tokenizer_load.load(opts.tokenizer), opts.eval_percent),
                 opts=opts, docs=docs, tokens=tokens)


def _count(d, t):
  with _WORKER["docs"].get_lock():
    _WORKER["docs"].value += d
    _WORKER["tokens"].value += t


def _run_in_worker(args):
  root, unit = args
  return unit, run_unit(root, unit, _WORKER["opts"], _WORKER["enc"], _count)


def _done(root: str, unit: Unit) -> bool:
  return os.path.exists(shards.unit_stem(root, unit.source, unit.index) + ".json")


def _pin_options(root: str, opts: Options, tok: tokenizer_base.Tokenizer) -> str:
  """Copies the tokenizer's files into the store and pins the options; returns the tokenizer sha256."""
  tok_dir = os.path.join(root, shards.TOKENIZER_DIR)
  os.makedirs(tok_dir, exist_ok=True)
  for name, data in tok.files().items():
    path = os.path.join(tok_dir, name)
    if not os.path.exists(path):
      _write_atomic(path, lambda t, data=data: _write_bytes(t, data))
  sha = tok.sha256
  key = opts.key(sha, tok.family)
  pinned = os.path.join(root, "prepare.json")
  if not os.path.exists(pinned):
    _write_atomic(pinned, lambda t: _write_json(t, key))
  with open(pinned, encoding="utf-8") as f:
    old = json.load(f)
  changed = [k for k in key if old.get(k) != key[k]]
  if changed:
    raise DataError(f"{root} was prepared with other options ({', '.join(changed)} differ, see "
                    f"{pinned}): use a new --out directory")
  return sha


def prepare(opts: Options, root: str, *, num_workers: int = 1, task_index: int = 0,
            num_tasks: int = 1, finalize_only: bool = False, wait_s: float = 86400.0,
            progress_s: float = 10.0, log: Optional[Callable[[str], None]] = None) -> Optional[dict]:
  """Prepares this task's units, then (task 0) writes the manifest; returns it (or None)."""
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  if not 0 <= task_index < num_tasks:
    raise DataError(f"--task_index={task_index} not in [0, --num_tasks={num_tasks})")
  shards.check_local(root)
  tok = tokenizer_load.load(opts.tokenizer)
  os.makedirs(root, exist_ok=True)
  sha = _pin_options(root, opts, tok)
  units = plan(opts)
  if not finalize_only:
    mine = [u for i, u in enumerate(units) if i % num_tasks == task_index and not _done(root, u)]
    _run_units(root, opts, mine, num_workers, progress_s, log)
  if task_index != 0:
    return None
  missing = [u for u in units if not _done(root, u)]
  t0 = time.time()
  while missing and not finalize_only and time.time() - t0 < wait_s:
    log(f"[prepare] waiting for {len(missing)} units of other tasks (first: {missing[0].input})")
    time.sleep(min(progress_s, 30.0))
    missing = [u for u in missing if not _done(root, u)]
  if missing:
    raise DataError(f"cannot finalize {root}: {len(missing)} units not prepared yet, first "
                    f"{missing[0].source} unit {missing[0].index} ({missing[0].input})")
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


def write_manifest(root, opts, tok, sha, units) -> dict:
  sources = {}
  for u in units:
    with open(shards.unit_stem(root, u.source, u.index) + ".json", encoding="utf-8") as f:
      marker = json.load(f)
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
  tok_files = {n: shards.sha256_file(os.path.join(root, shards.TOKENIZER_DIR, n))
               for n in sorted(os.listdir(os.path.join(root, shards.TOKENIZER_DIR)))
               if ".tmp-" not in n}
  manifest = dict(
      format_version=shards.FORMAT_VERSION, options=opts.key(sha, tok.family),
      tokenizer=dict(model=f"{shards.TOKENIZER_DIR}/{tok.main_file}", sha256=sha, family=tok.family,
                     files=tok_files, vocab_size=tok.vocab_size, layout=tok.layout,
                     pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id, unk_id=tok.unk_id,
                     mask_id=tok.mask_id, id_dtype=shards.id_dtype(tok.vocab_size).name),
      sources=sources)
  path = os.path.join(root, shards.MANIFEST)
  text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
  if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
    _write_atomic(path, lambda t: open(t, "w", encoding="utf-8").write(text))
  return manifest
