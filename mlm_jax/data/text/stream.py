"""tf.data pipeline: documents -> tokenizer -> packed rows -> mixed, batched, resumable.

`Pipeline(data_config, tokenizer, batch_size, seed, ...)` yields this host's int32 [batch, seq_len]
arrays (input_ids, segment_ids, positions, word_starts); its state is a batch count and resume replays
the stream to it, exactly. The full interface: docs/design_notes.md#stream.
"""
import atexit
import hashlib
import logging
import weakref
from typing import Optional, Sequence, Union

import tensorflow as tf

from mlm_jax.config import choices, defaults
from mlm_jax.data import fingerprint, specs
from mlm_jax.data.specs import mixing_weights
from mlm_jax.data.text import tf_packing
from mlm_jax.data.text import sources
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.data.tokenizers import load as tokenizer_load

FEATURES = tf_packing.FEATURES
_AUTOTUNE = tf.data.AUTOTUNE


def _seed(seed: int, *salt: int) -> int:
  """A derived op seed: distinct per use, stable across runs (tf.data seeds are int64)."""
  h = hashlib.sha256(repr((int(seed),) + tuple(int(s) for s in salt)).encode()).digest()
  return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def _doc_batches(docs: tf.data.Dataset, pretokenized: bool, tokenize, tokenize_batch: int):
  """Documents -> (batches of documents, batch -> ragged int32 ids).

  Tokenization runs inside the packer's first parallel map, one tokenizer call per batch:
  every separate tf.data stage costs per-element overhead that shows on small CPUs.
  """
  if pretokenized:
    return docs.ragged_batch(tokenize_batch), lambda r: r
  return docs.batch(tokenize_batch), tokenize


def _source_sizes(srcs, overrides: Sequence[str]) -> list:
  given = {}
  for item in overrides:
    name, value = specs.split_named(item)
    try:
      given[name] = float(value)
    except ValueError:
      raise sources.DataError(f"data.source_sizes entry {item!r}: expected name=number") from None
  unknown = set(given) - {s.name for s in srcs}
  if unknown:
    raise sources.DataError(f"data.source_sizes names unknown sources {sorted(unknown)}")
  return [given[s.name] if s.name in given else s.size() for s in srcs]


def build_dataset(data_config, tok: tokenizer_base.Tokenizer, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1, split: str = "train",
                  stats: Optional[sources.Stats] = None, with_source: bool = False,
                  repeat: Optional[bool] = None, fit: Optional[str] = None, skip_rows: int = 0) -> tf.data.Dataset:
  """The batched tf.data.Dataset behind `Pipeline` (no prefetch; options applied).

  `skip_rows`: rows of this host's stream read before the first batch (earlier phases of a run in
  phases that read the same order, with other batch sizes).

  `repeat=False` on the train split gives exactly one epoch of every source (tests, tools),
  ending like eval with the last partial row flushed and the last batch filled with padding.
  `fit`: the segmented packing's fit, if not `data.packing_fit`.
  """
  c = data_config
  if split not in ("train", "eval"):
    raise sources.DataError(f"split={split!r}: expected 'train' or 'eval'")
  choices.check("data.packing", c.packing)
  fit = fit or c.packing_fit
  choices.check("data.packing_fit", fit)
  window = int(c.get("packing_window", 256))
  if window < 1:
    raise sources.DataError(f"data.packing_window={window}: need at least 1 open row")
  if batch_size < 1:
    raise sources.DataError(f"batch_size={batch_size}: must be >= 1 per host")
  train = split == "train"
  repeat = train if repeat is None else repeat
  entries = tuple(c.sources) if train or not c.eval_sources else tuple(c.eval_sources)
  if not entries:
    raise sources.DataError(f"no data sources configured for split {split!r} "
                                "(set config.data.sources)")
  srcs = sources.parse_sources(entries, c.tfds_data_dir)
  holdout = ""
  if not c.eval_sources and c.eval_percent > 0:
    holdout = split
  elif not train and not c.eval_sources:
    raise sources.DataError("eval split needs data.eval_sources or data.eval_percent > 0")

  if stats is None:  # long lines are cut (and strict applies) whether or not anyone counts
    stats = new_stats(c)
  tokenize = tok.tf_tokenize()
  npc = c.num_parallel_calls if c.num_parallel_calls > 0 else _AUTOTUNE
  packer = tf_packing.Packer(tok, c.seq_len, stats, npc)
  rows = []
  mixing = train and repeat and len(srcs) > 1
  weights = mixing_weights(_source_sizes(srcs, c.source_sizes), c.mix_alpha) if mixing else [1.0] * len(srcs)
  for i, src in enumerate(srcs):
    docs = src.documents(
        process_index=process_index, process_count=process_count, doc_format=c.doc_format,
        shuffle_seed=_seed(seed, 1, i, process_index) if (train and c.shuffle_files) else None,
        repeat=repeat, holdout=holdout, eval_percent=c.eval_percent, stats=stats,
        num_parallel_reads=c.num_parallel_reads)
    if train and c.shuffle_buffer > 0:
      docs = docs.shuffle(c.shuffle_buffer, seed=_seed(seed, 2, i, process_index),
                          reshuffle_each_iteration=True)
    doc_batches, to_ids = _doc_batches(docs, src.tokenized, tokenize, c.tokenize_batch)
    if c.packing == "concat":
      r = packer.concat(doc_batches, to_ids, finite=not repeat)
    elif fit == "best":
      r = packer.segmented_best(doc_batches, to_ids, finite=not repeat, window=window)
    else:
      r = packer.segmented(doc_batches, to_ids, finite=not repeat)
    if train:   # the language mix as drawn, for the log (data/NAME/tokens): a few batches ahead of the step
      stats.track_source(src.name, weights[i])
      r = r.map(sources.as_written(lambda d, name=src.name: stats.count_row(name, d)))
    if with_source:
      r = r.map(sources.as_written(lambda d, i=i: dict(d, source=tf.constant(i, tf.int32))))
    rows.append(r)

  if len(rows) == 1:
    mixed = rows[0]
  elif mixing:
    logging.info("data: mixing %s", {s.name: round(w, 4) for s, w in zip(srcs, weights)})
    # Each host draws its own rows' sources (process 0 keeps the one-host stream's seed): with one
    # seed for all, row j of every host came from the same source, and a step's mix was P copies of one draw.
    mix_seed = _seed(seed, 3) if process_index == 0 else _seed(seed, 3, process_index)
    mixed = tf.data.Dataset.sample_from_datasets(rows, weights=weights, seed=mix_seed,
                                                 stop_on_empty_dataset=False)
  else:  # one pass over everything, in source order
    mixed = rows[0]
    for r in rows[1:]:
      mixed = mixed.concatenate(r)

  return _batched(mixed.skip(skip_rows) if skip_rows else mixed, batch_size, c, tok.pad_id, repeat)


def _batched(rows: tf.data.Dataset, batch_size: int, c, pad: int, repeat: bool) -> tf.data.Dataset:
  """Rows -> batches of static shape, with the pipeline's tf.data options. A finite stream keeps
  its last rows, filled up with padding rows to a full batch."""
  if repeat:
    batches = rows.batch(batch_size, drop_remainder=True)
  else:
    def fill_up(b):
      n = batch_size - tf.shape(b["input_ids"])[0]
      return {k: tf.pad(v, [[0, n]] + [[0, 0]] * (len(v.shape) - 1),
                        constant_values=pad if k == "input_ids" else 0) for k, v in b.items()}
    batches = rows.batch(batch_size).map(sources.as_written(fill_up))
  shape = [batch_size, c.seq_len]
  batches = batches.map(sources.as_written(lambda b: {k: tf.ensure_shape(v, shape[:len(v.shape)])
                                                    for k, v in b.items()}))

  options = tf.data.Options()
  options.deterministic = True
  options.threading.max_intra_op_parallelism = 1
  if c.threads > 0:
    options.threading.private_threadpool_size = c.threads
  return batches.with_options(options)


def new_stats(data_config) -> sources.Stats:
  """Repair counters with the config's policy (`data.strict`, `data.max_line_bytes`)."""
  limit = data_config.get("max_line_bytes", 1 << 16)
  if limit < 1024:
    raise sources.DataError(f"data.max_line_bytes={limit}: need at least 1024")
  return sources.Stats(strict=data_config.get("strict", False), max_line_bytes=limit)


def thread_settings(data_config) -> dict:
  """The tf.data threading in effect, for logs and benchmarks."""
  return dict(private_threadpool_size=data_config.threads or "tf-default",
              max_intra_op_parallelism=1,
              num_parallel_calls=data_config.num_parallel_calls if
              data_config.num_parallel_calls > 0 else "autotune",
              num_parallel_reads=data_config.num_parallel_reads,
              tokenize_batch=data_config.tokenize_batch, prefetch=data_config.prefetch,
              tf_inter_op=tf.config.threading.get_inter_op_parallelism_threads(),
              tf_intra_op=tf.config.threading.get_intra_op_parallelism_threads())


_LIVE = weakref.WeakSet()   # Pipelines with a running iterator, stopped before interpreter shutdown


@atexit.register
def _close_all() -> None:
  for p in list(_LIVE):
    p.close()


def _input_error(message: str) -> str:
  """A strict-mode assertion or a check_gzip DataError, raised inside tf.data -> one line."""
  text = " ".join(message.split())
  for marker in ("assertion failed: ", "DataError: "):
    if marker in text:
      text = text.split(marker, 1)[1]
  text = text.split(" [[")[0].split(" {{node")[0].split(" [Op:")[0]
  return text.replace("[", "").replace("]", "").strip()[:500]


class Pipeline:
  """Iterator of host-local batches with an exact, tiny resumable state (docs/design_notes.md#stream)."""

  def __init__(self, data_config, tokenizer: Union[tokenizer_base.Tokenizer, str],
               batch_size: int, seed: int, process_index: int = 0, process_count: int = 1,
               split: str = "train", rows_before: int = 0):
    """`rows_before`: rows of this host's stream that earlier phases read (build_dataset's skip_rows)."""
    self.tokenizer = (tokenizer_load.load(tokenizer) if isinstance(tokenizer, str) else tokenizer)
    self.config = data_config
    self.batch_size, self.seed, self.split = batch_size, seed, split
    self.process_index, self.process_count = process_index, process_count
    self.rows_before = int(rows_before)
    self._stats = new_stats(data_config)
    self.fit = data_config.packing_fit
    self._dataset = self._build()
    self._batches = 0
    self._iterator = None
    self._identities = None

  def _build(self) -> tf.data.Dataset:
    return build_dataset(self.config, self.tokenizer, self.batch_size, self.seed, self.process_index,
                         self.process_count, self.split, stats=self._stats, fit=self.fit, skip_rows=self.rows_before)

  @property
  def dataset(self) -> tf.data.Dataset:
    return self._dataset

  def _fingerprint(self, fit: Optional[str] = None) -> str:
    return fingerprint.digest(self.fingerprint_key(fit or self.fit))

  def fingerprint_key(self, fit: str) -> dict:
    """What the fingerprint of this stream packed with `fit` hashes: the data fields that decide its rows,
    the tokenizer (its sha256 and vocabulary size) and the sources by their content (data/fingerprint.py,
    so a moved corpus resumes)."""
    c = self.config
    key = dict(eval_percent=c.eval_percent, doc_format=c.doc_format, packing=c.packing,
               mix_alpha=c.mix_alpha, source_sizes=list(c.source_sizes),
               shuffle_buffer=c.shuffle_buffer, shuffle_files=c.shuffle_files,
               seq_len=c.seq_len, tokenize_batch=c.tokenize_batch,
               vocab_size=self.tokenizer.vocab_size, tokenizer=self.tokenizer.sha256, packing_fit=fit,
               **self._source_identities())
    if fit == "best":
      key["packing_window"] = int(c.packing_window)
    return key

  def resume_facts(self) -> dict:
    """What workdir/migrate.data_state needs to bring a state saved by an earlier version to today's form."""
    return dict(process_count=self.process_count, sources=list(self.config.sources),
                eval_sources=list(self.config.eval_sources),
                fingerprint_keys={fit: self.fingerprint_key(fit) for fit in choices.CHOICES["data.packing_fit"]})

  def _source_identities(self) -> dict:
    """data.sources and data.eval_sources by content (computed once: the files do not change)."""
    if self._identities is None:
      self._identities = {f: [fingerprint.source_identity(e) for e in self.config[f]]
                          for f in ("sources", "eval_sources")}
    return self._identities

  def _start(self, skip: int):
    ds = self._dataset.skip(skip) if skip else self._dataset
    self._stats.restart_drawn()   # the skipped batches are drawn (and counted) again: counts since the first row
    self._iterator = ds.prefetch(max(self.config.prefetch, 1)).as_numpy_iterator()
    _LIVE.add(self)

  def close(self) -> None:
    """Stop the tf.data iterator (its threads): Python stages (best-fit packing, Hugging Face
    tokenizers run in numpy_function) must not be running while the interpreter shuts down, where
    they wait for a GIL that is never handed over again."""
    self._iterator = None

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._iterator is None:
      self._start(self._batches)
    try:
      batch = next(self._iterator)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
      raise sources.DataError(_input_error(e.message)) from None
    self._batches += 1
    return batch

  def rewind(self) -> None:
    """Back to the first batch, without building the dataset again (evaluation reads it repeatedly)."""
    self._batches, self._iterator = 0, None

  def get_state(self) -> dict:
    """The position, as every process of a run holds it: each has read the same number of batches of
    its own part, so process 0's state (orbax writes the data item on the primary host only) is every
    process's, and `set_state` keeps its own process index."""
    return dict(version=1, batches=self._batches, seed=self.seed, split=self.split, batch_size=self.batch_size,
                process_count=self.process_count, rows_before=self.rows_before, fingerprint=self._fingerprint())

  def set_state(self, state: dict) -> None:
    """Continue after `state['batches']` batches of the same stream (checked by fingerprint); `state` is
    today's form (workdir/migrate.data_state brings an earlier one to it).

    Rows that were next-fit packed (the state's fingerprint names 'next') continue next-fit when the
    config holds only the default 'best', at every resume (`adopted_config`)."""
    saved = state.get("fingerprint")
    if self.fit == defaults.PACKING_FIT != "next" and saved == self._fingerprint("next"):
      logging.warning("data: the checkpoint's rows are next-fit packed; resuming with "
                      "data.packing_fit='next' (config.json records it; new runs pack by %s-fit)", self.fit)
      self.fit = "next"
      self._dataset = self._build()
    mine = self.get_state()
    count = state["process_count"]
    if count != self.process_count:
      raise sources.DataError(
          f"cannot resume the streaming input on {self.process_count} processes: its checkpoint read the corpus as "
          f"{count} per-process parts (data.per_host='shard'), which replay only on {count} processes. Rerun on "
          f"{count} processes, or train from a token store (tools/prepare_data.py; store:DIR sources resume on any "
          "process count)")
    for key in ("seed", "split", "batch_size", "rows_before", "fingerprint"):
      if key in state and state[key] != mine[key]:
        what = "the data config" if key == "fingerprint" else key
        raise sources.DataError(
            f"cannot resume data iterator: {what} differs from the checkpoint "
            f"({state[key]!r} saved, {mine[key]!r} now), so the same batches cannot be replayed")
    self._batches = int(state["batches"])
    self._start(self._batches)

  def adopted_config(self) -> dict:
    """The config fields this input took from the checkpoint instead of the config ({} if none)."""
    return {} if self.fit == self.config.packing_fit else {"data.packing_fit": self.fit}

  def stats(self) -> dict:
    """The repair counters, and (train split) each source's rows and real tokens this process has drawn,
    a few batches ahead of the step (prefetch), with `tokens` the run's: this process's x processes (each
    draws its own rows, with the same weights)."""
    out = self._stats.as_dict()
    drawn = self._stats.drawn()
    for s in drawn.values():
      s["tokens"] = s["tokens_local"] * self.process_count
    return dict(out, sources=drawn) if drawn else out
