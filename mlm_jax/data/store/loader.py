"""Training and eval batches from token stores, with an O(1) resumable state.

`StorePipeline` yields the batch dicts of the streaming path; global row r is a pure function of
(stores, data config, seed, r) and process p reads only its rows, so the state is a row count and
resume costs the same at any step and process count. Specs, curricula: docs/design_notes.md#loader.
"""
import collections
import concurrent.futures
import logging
from typing import Optional

import numpy as np

from mlm_jax.config import curricula, defaults
from mlm_jax.data import fingerprint
from mlm_jax.data.specs import is_store, mixing_weights, split_named
from mlm_jax.data.store import batch as store_batch
from mlm_jax.data.store import shards
from mlm_jax.data.store import index as store_index
from mlm_jax.errors import DataError

FEATURES = store_batch.FEATURES
PERMUTE_BLOCK = 4096
STATE_VERSION = 1
# Fields of config.data that decide the store stream (the rest only matter to prepare/streaming);
# packing_fit and packing_window are added by StorePipeline._key.
_KEY_FIELDS = ("sources", "packing", "seq_len", "mix_alpha", "source_sizes", "mix_alpha_schedule",
               "source_start_steps")


def store_tokenizer_path(data_config) -> str:
  """The tokenizer of the (first) store in data.sources; '' when sources are not stores."""
  if not data_config.sources or not is_store(data_config):
    return ""
  root, _ = shards.parse_store_spec(split_named(data_config.sources[0])[1])
  return shards.Store(root).tokenizer_path


class _Stream:
  """One source of one store, in one split: its documents and packing index."""

  def __init__(self, label, store, name, split, seq_len, packing, seed, salt, cache_dir,
               fit="next", window=0):
    self.label, self.store, self.name, self.split = label, store, name, split
    self._init_order(seed, salt)
    lens = store.lengths(name, split)
    key = dict(store=store.fingerprint, source=name, split=split, seq_len=seq_len,
               packing=packing, seed=seed if split == "train" else None)
    if store_index.index_version(packing, fit) > 1:   # next-fit keeps the key (and cache) it had
      key.update(fit=fit, window=window, fit_version=store_index.index_version(packing, fit))

    def make():
      n = np.arange(lens.size, dtype=np.int64)
      order = store_index.permute(n, seed, salt, -1, lens.size) if split == "train" else n
      return store_index.build(lens, seq_len, packing, order, fit, window)

    self.index = store_index.load_or_build(cache_dir, key, make,
                                           check=lambda a: store_index.check_packing(a, lens, seq_len, packing))
    self.index_dir = store_index.index_folder(cache_dir, key)
    self.rows = int(self.index["row_ptr"].shape[0] - 1)
    self.tokens = int(store.source(name)["tokens" if split == "train" else "eval_tokens"])
    # BOS/EOS included, as the rows carry them: for stats (exact at every epoch end).
    self.tokens_per_row = float(self.index["row_tokens"].sum()) / max(self.rows, 1)

  def _init_order(self, seed: int, salt: int) -> None:
    self.seed, self.salt = seed, salt
    self._block_id, self._block = -1, None   # packed_rows' cache

  def _permuted_block(self, b: int) -> np.ndarray:
    if b != self._block_id:
      rows = np.arange(b * PERMUTE_BLOCK, (b + 1) * PERMUTE_BLOCK, dtype=np.int64)
      epoch, j = np.divmod(rows, self.rows)
      values = np.empty_like(rows)
      for e in np.unique(epoch):
        at = epoch == e
        values[at] = store_index.permute(j[at], self.seed, self.salt, int(e), self.rows)
      self._block_id, self._block = b, values
    return self._block

  def packed_rows(self, k: np.ndarray) -> np.ndarray:
    """Source rows k (any epoch) -> packed row ids (stateless per-epoch permutation).

    The permutation is evaluated PERMUTE_BLOCK rows at a time and the last block kept: a batch's rows
    of a source are near each other, and a TensorFlow op call costs the same however few rows it
    permutes (docs/design_notes.md#loader).
    """
    if self.split == "eval":
      return k
    out = np.empty_like(k)
    blocks = k // PERMUTE_BLOCK
    for b in np.unique(blocks).tolist():
      sel = blocks == b
      out[sel] = self._permuted_block(b)[k[sel] - b * PERMUTE_BLOCK]
    return out


class StorePipeline:
  """Host-local batches of a token store (docs/design_notes.md#loader)."""

  def __init__(self, data_config, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, split: str = "train", cache_dir: Optional[str] = None):
    c = data_config
    if split not in ("train", "eval"):
      raise DataError(f"split={split!r}: expected 'train' or 'eval'")
    if c.packing not in ("segmented", "concat"):
      raise DataError(f"data.packing={c.packing!r}: expected 'segmented' or 'concat'")
    if batch_size < 1 or not 0 <= process_index < process_count:
      raise DataError(f"batch_size={batch_size}, process {process_index} of {process_count}: "
                      "need batch_size >= 1 and 0 <= process_index < process_count")
    if c.seq_len < 4:
      raise DataError(f"data.seq_len={c.seq_len}: need at least 4 (BOS, 2 tokens, EOS)")
    if split == "eval" and c.eval_sources:
      raise DataError("data.eval_sources with a token store: the store holds its eval split; "
                      "leave data.eval_sources empty")
    self.config, self.seed, self.split = c, seed, split
    self.batch_size, self.process_index, self.process_count = batch_size, process_index, process_count
    self.seq_len, self.packing = c.seq_len, c.packing
    self.fit, self.window = c.packing_fit, int(c.packing_window)
    if self.fit not in ("best", "next") or self.window < 1:
      raise DataError(f"data.packing_fit={self.fit!r}, data.packing_window={self.window}: expected "
                      "'best' or 'next' and a window of at least 1 open row")
    self._cache_dir = cache_dir or store_index.default_cache_dir()
    self._open_streams()
    self._rows = 0
    self._tokens = np.zeros(len(self.streams), np.int64)
    # Training batches in worker processes, `prefetch` (at least 2 per worker) started ahead; with
    # none, each batch is built in this process when asked (a thread would only share the GIL with
    # the training step's dispatch). The eval split is small and read now and then: in-process.
    self._num_workers = max(int(c.get("store_workers", 0)), 0) if split == "train" and self._assembler else 0
    self._workers = None   # started at the first batch
    depth = max(int(c.prefetch), 2 * self._num_workers)
    self._ahead = (_Ahead(self._submit, batch_size * process_count, depth) if self._num_workers else None)

  # -- setup -------------------------------------------------------------------------------
  def _open_streams(self) -> None:
    """Streams, mixing and assembler for the config and self.fit (set_state may change the fit)."""
    c = self.config
    self.streams = self._open(c, self.seed, self._cache_dir)
    tok = self.streams[0].store.manifest["tokenizer"]
    self.pad_id, self.bos_id, self.eos_id = tok["pad_id"], tok["bos_id"], tok["eos_id"]
    if self.split == "train":
      self._init_mixing(c)
    else:
      self._eval_ends = np.cumsum([s.rows for s in self.streams])
    self._assembler = self._make_assembler()

  def _open(self, c, seed, cache_dir):
    if c.tokenizer:
      want = {shards.Store(shards.parse_store_spec(split_named(e)[1])[0]).root
              for e in c.sources}
      for root in sorted(want):
        shards.Store(root).check_tokenizer(c.tokenizer)
    streams, stores, labels = [], {}, set()
    for entry in c.sources:
      label, spec = split_named(entry)
      root, names = shards.parse_store_spec(spec)
      store = stores.get(root) or stores.setdefault(root, shards.Store(root))
      names = names or sorted(store.sources)
      for name in names:
        store.source(name)
        full = (label if len(names) == 1 else f"{label}/{name}") if label else name
        if full in labels:
          raise DataError(f"two data.sources entries both give source {full!r}: name them")
        labels.add(full)
        streams.append(self._stream(full, store, name, c, seed, len(streams), cache_dir))
    vocab = {s.store.manifest["tokenizer"]["sha256"] for s in streams}
    if len(vocab) > 1:
      raise DataError(f"the stores of data.sources were prepared with {len(vocab)} different "
                      "tokenizers; prepare them with one")
    empty = [s.label for s in streams if s.rows == 0]
    if empty and (self.split == "train" or len(empty) == len(streams)):
      raise DataError(f"store source(s) {empty} have no {self.split} documents")
    return streams

  def _stream(self, label, store, name, c, seed, salt, cache_dir):
    return _Stream(label, store, name, self.split, c.seq_len, c.packing, seed, salt, cache_dir,
                   self.fit, self.window)

  def _init_mixing(self, c):
    given = dict(split_named(x) for x in c.source_sizes)
    labels = [s.label for s in self.streams]
    unknown = set(given) - set(labels)
    if unknown:
      raise DataError(f"data.source_sizes names unknown sources {sorted(unknown)}")
    sizes = [float(given.get(s.label, s.tokens)) for s in self.streams]
    starts = curricula.source_starts(c)
    unknown = set(starts) - set(labels)
    if unknown:
      raise DataError(f"data.source_start_steps names unknown sources {sorted(unknown)}; the sources "
                      f"are {labels}")
    bounds, phases = curricula.data_phases(c)
    global_batch = self.batch_size * self.process_count
    self._phase_steps, self._phase_rows = bounds, bounds * global_batch
    self.phase_alpha, self.phase_weights, self.phase_quotas, self._patterns = [], [], [], []
    for alpha, waiting in phases:
      active = np.array([s.label not in waiting for s in self.streams])
      if not active.any():
        raise DataError(f"data.source_start_steps: no source is drawn at step 0 ({list(c.source_start_steps)})")
      w = np.asarray(mixing_weights(sizes, alpha)) * active
      w = w / w.sum()
      q = store_index.quotas(w)
      self.phase_alpha.append(alpha)
      self.phase_weights.append(w)
      self.phase_quotas.append(q)
      self._patterns.append(store_index.mix_pattern(q))
    # Rows each phase takes from each source (the last phase is open-ended), and the sums before it.
    took = [self._taken(k, int(self._phase_rows[k + 1] - self._phase_rows[k]))
            for k in range(len(phases) - 1)]
    self._phase_offsets = np.cumsum([np.zeros(len(self.streams), np.int64)] + took, axis=0)
    self.weights, self.quotas = self.phase_weights[0], self.phase_quotas[0]
    if len(self.streams) > 1:
      logging.info("data: mixing %s", {s.label: round(float(w), 4)
                                         for s, w in zip(self.streams, self.weights)})
      if len(phases) > 1:
        logging.info("data: %d mixing phases from steps %s", len(phases), bounds.tolist())

  def _taken(self, k: int, n: int) -> np.ndarray:
    """Rows that the first n rows of phase k take from each source."""
    block, part = divmod(n, store_index.MIX_BLOCK)
    return block * self.phase_quotas[k] + np.bincount(self._patterns[k][0][:part], minlength=len(self.streams))

  def _phase_of(self, rows):
    return np.searchsorted(self._phase_rows, rows, side="right") - 1

  def consumed(self, rows: int) -> np.ndarray:
    """Rows taken from each source by the first `rows` global rows of the train stream."""
    k = int(self._phase_of(rows))
    return self._phase_offsets[k] + self._taken(k, rows - int(self._phase_rows[k]))

  # -- row addressing ----------------------------------------------------------------------
  def _locate(self, rows: np.ndarray):
    """Global rows -> (stream index, row of that stream's packing index); -1 = padding row."""
    if self.split == "eval":
      src = np.searchsorted(self._eval_ends, rows, side="right")
      valid = src < len(self.streams)
      starts = np.concatenate([[0], self._eval_ends])
      packed = np.where(valid, rows - starts[np.minimum(src, len(self.streams) - 1)], -1)
      return np.where(valid, src, -1), packed
    src, k = self._positions(rows)
    packed = np.empty_like(k)
    for i in np.unique(src):
      sel = src == i
      packed[sel] = self.streams[i].packed_rows(k[sel])
    return src, packed

  def _positions(self, rows: np.ndarray):
    """Train rows -> (stream index, the row's position k in that stream, over all epochs)."""
    src, k = np.empty_like(rows), np.empty_like(rows)
    phase = self._phase_of(rows)
    for p in np.unique(phase):
      sel = phase == p
      block, slot = np.divmod(rows[sel] - self._phase_rows[p], store_index.MIX_BLOCK)
      slot_source, slot_rank = self._patterns[p]
      src[sel] = slot_source[slot]
      k[sel] = self._phase_offsets[p][src[sel]] + block * self.phase_quotas[p][src[sel]] + slot_rank[slot]
    return src, k

  # -- rows -> batch -----------------------------------------------------------------------
  def _plan(self, first: int):
    """(stream, packed row) of each row of the host batch whose first global row is `first`."""
    return self._locate(first + np.arange(self.batch_size, dtype=np.int64))

  def _build(self, first: int) -> tuple:
    """(that batch, the counts it adds to the stats): a pure function of `first` (worker processes
    build batches ahead, see _Ahead); the counts are added as each batch is handed out."""
    return self._assembler(*self._plan(first))

  def _make_assembler(self):
    parts = [store_batch.Part(s.store, s.name, s.split, s.index, s.index_dir) for s in self.streams]
    return store_batch.Assembler(parts, self.seq_len, self.packing, self.pad_id, self.bos_id, self.eos_id)

  def _submit(self, first: int) -> concurrent.futures.Future:
    """Start building the batch at `first` in a worker process (which rows: decided here)."""
    if self._workers is None:
      self._workers = store_batch.Workers(self._assembler.spec(), self._num_workers)
    return self._workers.submit(*self._plan(first))

  def _count(self, tally: dict) -> None:
    self._tokens += tally["tokens"]

  # -- the Pipeline interface --------------------------------------------------------------
  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self.split == "eval" and self._rows >= int(self._eval_ends[-1]):
      raise StopIteration
    first = self._rows + self.process_index * self.batch_size
    try:
      batch, tally = self._ahead.get(first) if self._ahead else self._build(first)
    except DataError:
      self._stop_workers()   # a failed pipeline is done: its other workers end now, not when collected
      raise
    self._count(tally)
    self._rows += self.batch_size * self.process_count
    return batch

  def continue_after(self, rows: int) -> None:
    """Start after the first `rows` global rows (an earlier phase of the run read them, in this order)."""
    self._rows = int(rows)

  def rewind(self) -> None:
    self._rows = 0
    self._tokens[:] = 0
    if self._ahead:
      self._ahead.drop()

  def _key(self) -> dict:
    c = self.config
    key = {f: (list(c[f]) if isinstance(c[f], (tuple, list)) else c[f]) for f in _KEY_FIELDS}
    key["sources"] = self._portable_sources()
    key.update(seed=self.seed, split=self.split, mix_block=store_index.MIX_BLOCK,
               index_version=store_index.index_version(self.packing, self.fit), packing_fit=self.fit)
    if self.fit == "best":
      key["packing_window"] = self.window
    if self.split == "train" and curricula.has_data_schedule(c):
      key["global_batch"] = self.batch_size * self.process_count   # phases are in steps
    return key

  def _portable_sources(self) -> list:
    """data.sources with each store named by its manifest fingerprint instead of its path: a store
    moved or copied elsewhere (another disk, mount or host) is the same store."""
    by_root = {s.store.root: s.store.fingerprint for s in self.streams}
    out = []
    for entry in self.config.sources:
      label, spec = split_named(entry)
      root, names = shards.parse_store_spec(spec)
      out.append((f"{label}=" if label else "") + f"store:{by_root[root]}" + (f":{','.join(names)}" if names else ""))
    return out

  def get_state(self) -> dict:
    """{'rows': global rows consumed, 'stores': fingerprints, 'config': the stream's fields}."""
    key = self._key()
    return dict(version=STATE_VERSION, kind="store", rows=self._rows,
                stores={s.label: s.store.fingerprint for s in self.streams}, config=key,
                fingerprint=fingerprint.digest(key),
                tokens_local={s.label: int(t) for s, t in zip(self.streams, self._tokens)})

  def set_state(self, state: dict) -> None:
    """Continue after `state['rows']` global rows: O(1), any process count or batch size. `state` is
    today's form (workdir/migrate.data_state brings an earlier one to it)."""
    if state.get("kind") != "store":
      raise DataError("cannot resume from a streaming-pipeline data state with a token store "
                      "(data.sources changed from text to store:)")
    self._adopt_fit(state)
    mine = self.get_state()
    for label, fp in state["stores"].items():
      if mine["stores"].get(label) != fp:
        raise DataError(f"cannot resume: store of source {label!r} differs from the checkpoint "
                        f"(manifest fingerprint {fp} saved, {mine['stores'].get(label)} now)")
    for k, v in sorted(state["config"].items(), key=lambda kv: kv[0] == "index_version"):  # the cause first
      if mine["config"].get(k) != v:
        what = (k if k in ("seed", "split", "mix_block", "index_version") else
                "train.batch_size (data phases are in steps)" if k == "global_batch" else f"data.{k}")
        raise DataError(f"cannot resume: {what} changed ({v!r} saved, {mine['config'].get(k)!r} "
                        "now), so the saved position names other rows")
    self._rows = int(state["rows"])
    self._tokens[:] = [state.get("tokens_local", {}).get(s.label, 0) for s in self.streams]

  def _adopt_fit(self, state: dict) -> None:
    """A run whose rows were next-fit packed (its state names 'next') continues on those rows when the
    config holds only the default 'best', every time it resumes (`adopted_config` tells config.json); an
    explicit 'next' against saved 'best' rows is refused."""
    saved = state["config"]["packing_fit"]
    if saved == self.fit or self.fit != defaults.PACKING_FIT or saved not in ("best", "next"):
      return
    logging.warning("data: the checkpoint's rows are %s-fit packed; resuming with data.packing_fit=%r "
                    "(config.json records it; new runs pack by %s-fit)", saved, saved, self.fit)
    self.fit = saved
    self._stop_workers()
    self._open_streams()

  def adopted_config(self) -> dict:
    """The config fields this input took from the checkpoint instead of the config ({} if none)."""
    return {} if self.fit == self.config.packing_fit else {"data.packing_fit": self.fit}

  def resume_facts(self) -> dict:
    """What workdir/migrate.data_state needs to bring a state saved by an earlier version to today's form."""
    return dict(sources=list(self.config.sources), portable_sources=self._portable_sources())

  def _stop_workers(self) -> None:
    if self._workers is not None:
      self._workers.close()
      self._workers = None
    if self._ahead:
      self._ahead.drop()

  def stats(self) -> dict:
    """Per source: global rows and epochs consumed, real tokens this process read, and the share of
    its rows' slots that hold a real token (BOS/EOS included; exact over an epoch)."""
    out, extra = {}, {}
    if self.split == "train":
      rows = self.consumed(self._rows)
      k = int(self._phase_of(max(self._rows - 1, 0)))   # the phase of the last row read
      weights = self.phase_weights[k]
      if len(self._phase_rows) > 1:
        extra = dict(mix_alpha=float(self.phase_alpha[k]), phase=k)
    else:
      rows = np.clip(self._rows - np.concatenate([[0], self._eval_ends[:-1]]), 0,
                     [s.rows for s in self.streams])
    for i, s in enumerate(self.streams):
      out[s.label] = dict(rows=int(rows[i]), epochs=float(rows[i]) / s.rows if s.rows else 0.0,
                          tokens_local=int(self._tokens[i]),
                          tokens=int(round(rows[i] * s.tokens_per_row)),
                          real_fraction=s.tokens_per_row / self.seq_len)   # of its rows' slots, per epoch
      if self.split == "train":
        out[s.label]["weight"] = float(weights[i])
    return dict(rows=self._rows, sources=out, **extra)


class _Ahead:
  """The next `depth` batches, started ahead of the consumer (train split: it never ends).

  Each batch is a pure function of its first row, so workers may build batches first, first+step,
  ... in any order; get(first) hands them out in order. A `first` other than the expected one
  (after set_state or rewind) drops what was started and starts over there.
  """

  def __init__(self, submit, step: int, depth: int):
    self._submit, self._step, self._depth = submit, step, depth
    self._queue, self._next = collections.deque(), None

  def get(self, first: int):
    if not self._queue or self._queue[0][0] != first:
      self.drop()
      self._next = first
    while len(self._queue) < self._depth:
      self._queue.append((self._next, self._submit(self._next)))
      self._next += self._step
    return self._queue.popleft()[1].result()

  def drop(self) -> None:
    self._queue.clear()   # what was sent is built anyway, and its result thrown away
