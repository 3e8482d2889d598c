"""Packed rows of token stores -> batch arrays, in this process or in worker processes.

`Assembler` gathers a batch with numpy over whole streams; `Workers` runs `data.store_workers` plain
subprocesses (`python -m mlm_jax.data.store.batch`, numpy and array_record only). The loader picks
the rows, so a batch is the same whoever builds it. Why processes: docs/design_notes.md#batch.
"""
import collections
import concurrent.futures
import os
import pickle
import signal
import subprocess
import sys
import threading
import weakref

import numpy as np

from mlm_jax.data.store import shards
from mlm_jax.data.store import index as store_index
from mlm_jax.errors import DataError

WORKER_MODULE = "mlm_jax.data.store.batch"   # this module, run as each worker's main
FEATURES = ("input_ids", "segment_ids", "positions", "word_starts")
# What Assembler needs of a stream (index_dir: where `index` is memory-mapped from, for workers)
Part = collections.namedtuple("Part", "store name split index index_dir")


class Assembler:
  """(stream index, packed row; -1 = padding) per row -> (batch, tokens read per stream)."""

  def __init__(self, parts, seq_len: int, packing: str, pad_id: int, bos_id: int, eos_id: int):
    self.parts, self.seq_len, self.packing = parts, seq_len, packing
    self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

  def spec(self) -> dict:
    """What a worker needs to build the same Assembler (assembler_from_spec): paths, not arrays."""
    return dict(parts=[(p.store.root, p.name, p.split, p.index_dir) for p in self.parts],
                args=dict(seq_len=self.seq_len, packing=self.packing, pad_id=self.pad_id, bos_id=self.bos_id,
                          eos_id=self.eos_id))

  def __call__(self, src: np.ndarray, packed: np.ndarray) -> tuple:
    n, s = len(src), self.seq_len
    out = {k: np.zeros((n, s), np.int32) for k in FEATURES}
    out["input_ids"][:] = self.pad_id
    tokens = np.zeros(len(self.parts), np.int64)
    for i in np.unique(src[src >= 0]).tolist():
      part, sel = self.parts[i], np.nonzero(src == i)[0]
      index, rows = part.index, packed[sel]
      tokens[i] = int(index["row_tokens"][rows].sum())
      lo = index["row_ptr"][rows]
      count = index["row_ptr"][rows + 1] - lo
      first = np.repeat(np.cumsum(count) - count, count)       # each piece's row's first piece
      pieces = np.repeat(lo, count) + np.arange(first.size) - first
      doc_ids, doc = np.unique(index["piece_doc"][pieces], return_inverse=True)
      docs = part.store.read_joined(part.name, part.split, doc_ids)
      self._fill(out, docs, np.repeat(sel, count), first, doc.reshape(-1),
                 index["piece_start"][pieces].astype(np.int64), index["piece_len"][pieces].astype(np.int64))
    return out, dict(tokens=tokens)

  def _fill(self, out, docs, row, first, doc, start, length):
    """Write pieces (row, first piece of that row, document, start, length) into the batch.

    segmented: piece = BOS + tokens[start:start+length] + EOS, segment id = its rank in the row + 1,
    positions from 0, its first token a word start (a chunk may begin mid-word); concat: the piece
    is positions [start, start+length) of the document wrapped as BOS + tokens + EOS, one segment
    per row.
    """
    segmented = self.packing == "segmented"
    span = length + 2 if segmented else length
    before = np.cumsum(span) - span                              # elements before each piece
    piece = np.repeat(np.arange(span.size), span)
    j = np.arange(piece.size) - before[piece]                    # element within its piece
    flat = (row * self.seq_len + before - before[first])[piece] + j   # where it goes in the batch
    d = doc[piece]
    wrapped = j if segmented else start[piece] + j               # 0 = BOS
    bos = wrapped == 0
    eos = wrapped == (length[piece] + 1 if segmented else docs.lengths[d] + 1)
    inner = ~(bos | eos)
    t = (start[piece] + j - 1 if segmented else wrapped - 1)[inner]
    ids = np.where(bos, self.bos_id, self.eos_id)
    ids[inner] = docs.ids(d[inner], t)
    ws = np.ones(piece.size, np.int32)
    ws[inner] = docs.word_starts(d[inner], t)
    if segmented:
      ws[j == 1] = 1
      segment, position = np.arange(span.size) - first + 1, j
      segment = segment[piece]
    else:
      position = flat % self.seq_len
      ws[position == 0] = 1
      segment = 1
    for k, v in (("input_ids", ids), ("word_starts", ws), ("segment_ids", segment), ("positions", position)):
      out[k].reshape(-1)[flat] = v


def assembler_from_spec(spec: dict) -> Assembler:
  """An Assembler from what crosses the pipe: store roots and index folders, not arrays."""
  stores, parts = {}, []
  for root, name, split, index_dir in spec["parts"]:
    store = stores.get(root) or stores.setdefault(root, shards.Store(root))
    parts.append(Part(store, name, split, store_index.load(index_dir), index_dir))
  return Assembler(parts, **spec["args"])


class Workers:
  """`n` worker processes building batches; submit(src, packed) -> a Future of (batch, tally).

  A worker ends when its stdin closes: close(), this object being collected, the interpreter
  exiting, or the training process dying.
  """

  def __init__(self, spec: dict, n: int):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    self._procs, self._pending, self._lock, self._seq = [], [], threading.Lock(), 0
    for k in range(n):
      proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env)
      pickle.dump(spec, proc.stdin)
      proc.stdin.flush()
      self._procs.append(proc)
      self._pending.append({})
      # the reader thread holds the process, its pending futures and the lock, not self
      threading.Thread(target=_replies, args=(proc, self._pending[k], self._lock), daemon=True,
                       name=f"store-worker-{k}").start()
    self._finalizer = weakref.finalize(self, _stop, list(self._procs))

  def submit(self, src: np.ndarray, packed: np.ndarray) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    with self._lock:
      k = min(range(len(self._procs)), key=lambda i: len(self._pending[i]))
      proc, pending = self._procs[k], self._pending[k]
      self._seq += 1
      pending[self._seq] = future
      try:
        if proc.poll() is not None:
          raise BrokenPipeError
        pickle.dump((self._seq, src, packed), proc.stdin)
        proc.stdin.flush()
      except (BrokenPipeError, OSError):
        _fail(proc, pending)
    return future

  def close(self) -> None:
    self._finalizer()


def _replies(proc, pending: dict, lock) -> None:
  """A worker's replies -> its futures; when it is gone, what it owed fails."""
  while True:
    try:
      seq, ok, payload = pickle.load(proc.stdout)
    except (EOFError, OSError, pickle.UnpicklingError):
      with lock:
        _fail(proc, pending)
      return
    with lock:
      future = pending.pop(seq, None)
    if future is not None and not future.done():
      future.set_result(payload) if ok else future.set_exception(DataError(payload))


def _fail(proc, pending: dict) -> None:
  """Fail every future a dead worker owed, in one line (called with the lock held)."""
  if not pending:
    return
  try:
    code = proc.wait(timeout=5)
  except subprocess.TimeoutExpired:
    code = None
  for future in pending.values():
    if not future.done():
      future.set_exception(DataError(f"store batch worker (pid {proc.pid}) exited with code {code}; "
                                     "its output is above; set data.store_workers=0 to build batches "
                                     "in the training process"))
  pending.clear()


def _stop(procs) -> None:
  for p in procs:
    try:
      p.stdin.close()
    except OSError:
      pass
  for p in procs:
    try:
      p.wait(timeout=5)
    except subprocess.TimeoutExpired:
      p.kill()


def _worker_main() -> int:
  """Read the spec, then (seq, src, packed) requests until stdin closes; reply (seq, ok, payload)."""
  inp, out = sys.stdin.buffer, sys.stdout.buffer
  sys.stdout = sys.stderr    # nothing but replies may reach the pipe
  # Ctrl-C and preemption signals are the trainer's to handle; a worker ends when its stdin closes
  # (the trainer closed it, or died).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  try:
    assemble = assembler_from_spec(pickle.load(inp))
  except EOFError:
    return 0
  except DataError as e:
    print(f"store batch worker: {e}", file=sys.stderr)
    return 1
  while True:
    try:
      seq, src, packed = pickle.load(inp)
    except EOFError:
      return 0
    try:
      reply = (seq, True, assemble(src, packed))
    except DataError as e:
      reply = (seq, False, str(e))
    except Exception as e:  # noqa: BLE001 - the parent shows it as one line
      reply = (seq, False, f"store batch worker: {e.__class__.__name__}: {e}")
    pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


if __name__ == "__main__":
  sys.exit(_worker_main())
