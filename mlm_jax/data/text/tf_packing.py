"""Streaming packing: tokenized documents -> fixed-length rows, inside the tf.data graph (the placement
of documents in rows is data/packing.py's; this adapter lays the tokens out).

`segmented` rows (whole documents or chunks, each in BOS/EOS, numbered by segment id) by best fit over
`data.packing_window` rows carried across batches, or by next fit within a batch; `concat` rows are
RoBERTa's FULL-SENTENCES stream. Details: docs/design_notes.md#tf_packing.
"""
import functools

import numpy as np
import tensorflow as tf

from mlm_jax.data import packing
from mlm_jax.data.text import sources
from mlm_jax.data.tokenizers import base as tokenizer_base

FEATURES = ("input_ids", "segment_ids", "positions", "word_starts")


class Packer:
  """Token streams -> fixed-length rows. Holds the tokenizer-derived constants."""

  def __init__(self, tok: tokenizer_base.Tokenizer, seq_len: int, stats, num_parallel_calls):
    if seq_len < 4:
      raise sources.DataError(f"data.seq_len={seq_len}: need at least 4 (BOS, 2 tokens, EOS)")
    self.seq_len = seq_len
    self.bos, self.eos, self.pad = tok.bos_id, tok.eos_id, tok.pad_id
    self.word_start = tf.constant(np.asarray(tok.word_start_table(), np.int32))
    after = tok.after_space_table()
    self.after_space = None if after is None else tf.constant(np.asarray(after, np.int32))
    self.stats = stats
    self.npc = num_parallel_calls

  def _chunks(self, ids: tf.RaggedTensor, max_len: int):
    """[docs, None] ids -> ([chunks, None] ids, word starts) with chunks of <= max_len tokens."""
    lens = ids.row_lengths()
    n_chunks = (lens + max_len - 1) // max_len
    first_chunk = tf.cumsum(n_chunks, exclusive=True)
    offset = tf.ragged.range(lens).flat_values
    chunk_of_token = tf.repeat(first_chunk, lens) + offset // max_len
    values = ids.flat_values
    ws = self._starts(values)
    ws = tf.where(offset % max_len == 0, 1, ws)  # the first token of a document / chunk
    nrows = tf.reduce_sum(n_chunks)
    if self.stats is not None:
      with tf.control_dependencies([self.stats.add("long_docs_split", tf.reduce_sum(
          tf.cast(n_chunks > 1, tf.int64)))]):
        nrows = tf.identity(nrows)
    # Row ids sorted and below nrows by construction: no validation ops (their asserts cost graph
    # building at every pipeline's start and a check per batch).
    chunk_ids = tf.RaggedTensor.from_value_rowids(values, chunk_of_token, nrows=nrows, validate=False)
    chunk_ws = tf.RaggedTensor.from_value_rowids(ws, chunk_of_token, nrows=nrows, validate=False)
    return self._wrap(chunk_ids), self._wrap(chunk_ws, special=1)

  def _starts(self, values):
    """Word-start flags of a flat run of ids (the first token of a document is set by the caller)."""
    ws = tf.gather(self.word_start, values)
    if self.after_space is None:
      return ws
    prev = tf.concat([tf.zeros([1], tf.int32), tf.gather(self.after_space, values[:-1])], 0)
    return tf.maximum(ws, prev[:tf.size(values)])

  def _wrap(self, rt, special=None):
    n = rt.nrows()
    bos = tf.fill([n, 1], tf.constant(self.bos if special is None else special, rt.dtype))
    eos = tf.fill([n, 1], tf.constant(self.eos if special is None else special, rt.dtype))
    return tf.concat([bos, rt, eos], axis=1)

  # -- segmented ---------------------------------------------------------------------------
  def segmented(self, doc_batches: tf.data.Dataset, to_ids, finite: bool) -> tf.data.Dataset:
    """Next-fit packing of whole documents (chunks) into rows, one batch of documents at a time.

    Each tokenized batch is packed on its own (a parallel, stateless map), so only its last row
    can be short: a little fill traded for stateless parallelism (docs/design_notes.md#tf_packing).
    """
    del finite  # every batch is flushed: nothing is ever left over
    s = self.seq_len
    pack = sources.as_written(lambda b: self._pack_rows(*self._chunks(to_ids(b), s - 2)))
    return doc_batches.map(pack, num_parallel_calls=self.npc).unbatch()

  def _pack_rows(self, ids: tf.RaggedTensor, ws: tf.RaggedTensor) -> dict:
    """Chunks (each <= seq_len, BOS/EOS included) -> {feature: [rows, seq_len]}."""
    s = self.seq_len
    lens = tf.cast(ids.row_lengths(), tf.int32)
    n = tf.size(lens)
    first = tf.cast(tf.ensure_shape(tf.numpy_function(functools.partial(packing.next_fit, seq_len=s), [lens],
                                                      tf.int64, stateful=False), [None]), tf.int32)
    nrows = tf.size(first)
    row_of_chunk = tf.searchsorted(first, tf.range(n), side="right") - 1
    row_first = tf.gather(first, row_of_chunk)   # the first chunk of each chunk's row
    before = tf.cumsum(lens, exclusive=True)
    offset = before - tf.gather(before, row_first)
    seg_of_chunk = tf.range(n) - row_first + 1
    pos = tf.ragged.range(lens).flat_values
    where = tf.stack([tf.repeat(row_of_chunk, lens), tf.repeat(offset, lens) + pos], axis=1)
    shape = tf.stack([nrows, s])

    def scatter(values):
      return tf.scatter_nd(where, tf.cast(values, tf.int32), shape)

    real = scatter(tf.ones_like(pos)) > 0
    return dict(input_ids=tf.where(real, scatter(ids.flat_values), self.pad),
                segment_ids=scatter(tf.repeat(seg_of_chunk, lens)),
                positions=scatter(pos),
                word_starts=scatter(ws.flat_values))

  def segmented_best(self, doc_batches: tf.data.Dataset, to_ids, finite: bool,
                     window: int) -> tf.data.Dataset:
    """Best-fit packing of documents (chunks) over `window` open rows carried across batches.

    The chunking stays a parallel map; the packing is one sequential scan whose state is the open
    rows ([window, seq_len] per feature), so it is a pure function of the document stream, which
    the seed and file order fix (resume replays it). A finite stream ends with a flush.
    """
    s = self.seq_len

    def chunks(b):
      ids, ws = self._chunks(to_ids(b), s - 2)
      return (tf.cast(ids.flat_values, tf.int32), tf.cast(ws.flat_values, tf.int32),
              tf.cast(ids.row_lengths(), tf.int32), tf.constant(False))

    groups = doc_batches.map(sources.as_written(chunks), num_parallel_calls=self.npc)
    if finite:
      empty = tf.zeros([0], tf.int32)
      groups = groups.concatenate(tf.data.Dataset.from_tensors((empty, empty, empty, tf.constant(True))))
    rows = tf.fill([window, s], tf.constant(self.pad, tf.int32))
    zeros = tf.zeros([window, s], tf.int32)
    init = (rows, zeros, zeros, zeros, tf.zeros([window], tf.int32), tf.fill([window], tf.constant(-1, tf.int64)))
    fn = functools.partial(_best_fit_step, s, window, self.pad)

    def step(state, group):
      out = tf.numpy_function(fn, [*state, *group], [tf.int32] * 5 + [tf.int64] + [tf.int32] * 4,
                              stateful=False)
      for t in out[:4]:
        t.set_shape([window, s])
      for t in out[4:6]:
        t.set_shape([window])
      for t in out[6:]:
        t.set_shape([None, s])
      return tuple(out[:6]), dict(zip(FEATURES, out[6:]))

    return groups.scan(init, sources.as_written(step)).unbatch()

  # -- concat ------------------------------------------------------------------------------
  def concat(self, doc_batches: tf.data.Dataset, to_ids, finite: bool) -> tf.data.Dataset:
    """RoBERTa FULL-SENTENCES: one stream of <s> doc </s> <s> doc </s> ... cut every seq_len."""
    s = self.seq_len

    def flatten(b):
      r = to_ids(b)
      lens = r.row_lengths()
      offset = tf.ragged.range(lens).flat_values
      ws = tf.where(offset == 0, 1, self._starts(r.flat_values))
      ids = self._wrap(r).flat_values
      ws = self._wrap(tf.RaggedTensor.from_row_lengths(ws, lens), special=1).flat_values
      return ids, ws

    pieces = doc_batches.map(sources.as_written(flatten), num_parallel_calls=self.npc)
    if finite:
      pieces = pieces.concatenate(tf.data.Dataset.from_tensors(
          (tf.zeros([0], tf.int32), tf.zeros([0], tf.int32))))
    init = dict(ids=tf.fill([s], self.pad), ws=tf.zeros([s], tf.int32), fill=tf.constant(0))

    def step(st, piece):
      ids, ws = piece
      flush = tf.equal(tf.size(ids), 0)
      all_ids = tf.concat([st["ids"][:st["fill"]], ids], 0)
      all_ws = tf.concat([st["ws"][:st["fill"]], ws], 0)
      total = tf.size(all_ids)
      k = total // s
      # A flush turns a non-empty remainder into one last, padded row.
      pad_to = tf.where(tf.logical_and(flush, total % s > 0), (k + 1) * s, k * s)
      padn = pad_to - total
      rows_ids = tf.reshape(tf.pad(all_ids, [[0, tf.maximum(padn, 0)]], constant_values=self.pad)
                            [:pad_to], [-1, s])
      rows_ws = tf.reshape(tf.pad(all_ws, [[0, tf.maximum(padn, 0)]])[:pad_to], [-1, s])
      real = tf.reshape(tf.range(pad_to) < total, [-1, s])
      out = dict(input_ids=rows_ids,
                 segment_ids=tf.cast(real, tf.int32),
                 positions=tf.where(real, tf.range(s)[None, :], 0),
                 word_starts=tf.where(tf.range(s)[None, :] == 0, 1, rows_ws) * tf.cast(real, tf.int32))
      rem = tf.where(flush, 0, total - k * s)
      new = dict(ids=tf.pad(all_ids[k * s:][:rem], [[0, s - rem]], constant_values=self.pad),
                 ws=tf.pad(all_ws[k * s:][:rem], [[0, s - rem]]), fill=rem)
      return new, out

    return pieces.scan(init, sources.as_written(step)).unbatch()


def _best_fit_step(seq_len, window, pad, ids, ws, seg, pos, fill, row, chunk_ids, chunk_ws, lens,
                   flush):
  """One batch of chunks (BOS/EOS included) into the open rows -> (new open rows, closed rows).

  Open rows: [window, seq_len] ids, word starts, segment ids, positions, then each row's fill and
  number (packing.Window's state); the closed rows come out as four [closed, seq_len] arrays in
  the order of FEATURES (input_ids, segment_ids, positions, word_starts).
  """
  ids, ws, seg, pos = (np.array(a) for a in (ids, ws, seg, pos))   # the inputs are TF's buffers
  win = packing.Window(seq_len, window, fill, row)
  slots, offsets, _, closed = win.place(lens.tolist())
  starts = (np.cumsum(lens) - lens).tolist()
  out = []

  def emit(slot):
    out.append((ids[slot].copy(), seg[slot].copy(), pos[slot].copy(), ws[slot].copy()))
    ids[slot], ws[slot], seg[slot], pos[slot] = pad, 0, 0, 0

  c = 0
  for i, n in enumerate(lens.tolist()):
    while c < len(closed) and closed[c][0] == i:
      emit(closed[c][1])
      c += 1
    k, a, b = slots[i], offsets[i], starts[i]
    ids[k, a:a + n] = chunk_ids[b:b + n]
    ws[k, a:a + n] = chunk_ws[b:b + n]
    seg[k, a:a + n] = seg[k, a - 1] + 1 if a else 1
    pos[k, a:a + n] = np.arange(n)
  for _, slot, _ in closed[c:]:
    emit(slot)
  new_fill, new_row = np.asarray(win.fill, np.int32), np.asarray(win.row, np.int64)
  if flush:
    for slot in win.open_slots():
      emit(slot)
    new_fill[:], new_row[:] = 0, -1
  done = [np.stack([o[f] for o in out]) if out else np.zeros([0, seq_len], np.int32) for f in range(4)]
  return (ids, ws, seg, pos, new_fill, new_row, *done)
