"""Stateless order of a token store: permutations, packing index, alpha-mixing pattern.

Everything is a pure function of (store, data config, seed), so global row r is located in O(1) for
any r, on any host, after any restart. How each part does it: docs/design_notes.md#index.
"""
import hashlib
import json
import logging
import os
import shutil
import tempfile

import numpy as np

from mlm_jax import paths
from mlm_jax.data import packing
from mlm_jax.errors import DataError

INDEX_VERSION = 1   # of the cache folder's format (the files below)
# The packing's version (index_version), in the index cache key and in the data state: 1 = next-fit
# (unchanged since the first stores, so caches and states saved before best-fit existed still
# match), 2 = best-fit.
_FIT_VERSION = {"next": 1, "best": 2}
MIX_BLOCK = 4096
_ARRAYS = ("piece_doc", "piece_start", "piece_len", "row_ptr", "row_tokens")


def permute(index, seed: int, salt: int, epoch: int, size: int) -> np.ndarray:
  """Stateless permutation of [0, size) evaluated at `index` (int64 array)."""
  import tensorflow as tf  # the op is stateless and versioned: pinned by a known-answer test
  index = np.asarray(index, np.int64)
  if size <= 1 or index.size == 0:
    return index.copy()
  key = int.from_bytes(hashlib.sha256(repr((seed, salt, epoch)).encode()).digest()[:8], "little")
  seeds = np.array([key & 0x7FFFFFFF, key >> 33], np.int64)
  return tf.random.experimental.index_shuffle(index, seeds, np.int64(size - 1)).numpy()


def index_version(packing: str, fit: str) -> int:
  """The version of the index that (packing, fit) builds (concat rows do not depend on the fit)."""
  return _FIT_VERSION[fit] if packing == "segmented" else 1


def _best_fit(wrapped: np.ndarray, seq_len: int, window: int) -> np.ndarray:
  """The row of each item of a best-fit packing of items of these lengths (<= seq_len), rows
  numbered 0.. in the order they were opened.

  The rows still open when the items run out (up to `window`, often half full: a few % of a small
  source's rows) are packed again, their items longest first (best-fit decreasing, which fills
  rows nearly completely when the sizes vary): offline, the index can see the end coming.
  """
  win = packing.Window(seq_len, window)
  rows = np.frombuffer(win.place(wrapped.tolist())[2], np.int64).copy()
  tail = np.nonzero(np.isin(rows, [win.row[k] for k in win.open_slots()]))[0]
  if tail.size > 1:
    by_size = tail[np.argsort(-wrapped[tail], kind="stable")]
    again = packing.Window(seq_len, tail.size).place(wrapped[by_size].tolist())[2]
    rows[by_size] = win.rows + np.frombuffer(again, np.int64)
  return np.unique(rows, return_inverse=True)[1].reshape(-1)   # rows 0.., no gaps


def _segmented(order, lens, seq_len, fit="next", window=0):
  body = seq_len - 2
  ol = lens[order].astype(np.int64)
  n_chunks = np.maximum((ol + body - 1) // body, 1)
  doc = np.repeat(order, n_chunks)
  first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
  k = np.arange(doc.size) - first
  start = k * body
  length = np.minimum(np.repeat(ol, n_chunks) - start, body)
  if fit == "best" and doc.size:
    row = _best_fit(length + 2, seq_len, window)
    by_row = np.argsort(row, kind="stable")    # a row's pieces together, in the order placed
    doc, start, length = doc[by_row], start[by_row], length[by_row]
    starts = np.searchsorted(row[by_row], np.arange(int(row.max()) + 1))
  else:
    starts = packing.next_fit(length + 2, seq_len)
  row_ptr = np.append(starts, doc.size)
  row_tokens = np.add.reduceat(length + 2, starts) if doc.size else np.zeros(0, np.int64)
  return doc, start, length, row_ptr, row_tokens


def _concat(order, lens, seq_len):
  """Pieces in the wrapped coordinates of a document: 0 = BOS, 1..n = tokens, n+1 = EOS."""
  wl = lens[order].astype(np.int64) + 2
  doc_pos, start, length, row = packing.concat_pieces(wl, seq_len)
  total = int(wl.sum())
  n_rows = (total + seq_len - 1) // seq_len
  row_ptr = np.searchsorted(row, np.arange(n_rows + 1))
  row_tokens = np.minimum(seq_len, total - np.arange(n_rows) * seq_len)
  return order[doc_pos], start, length, row_ptr, row_tokens


def build(lens: np.ndarray, seq_len: int, packing: str, order: np.ndarray, fit: str = "next",
          window: int = 0) -> dict:
  order = np.asarray(order, np.int64)
  if packing == "segmented":
    arrays = _segmented(order, lens, seq_len, fit, window)
  else:
    arrays = _concat(order, lens, seq_len)
  dtypes = (np.int64, np.int32, np.int32, np.int64, np.int32)
  return {k: np.asarray(a, d) for k, a, d in zip(_ARRAYS, arrays, dtypes)}


def default_cache_dir() -> str:
  """A folder of this user's own under the temporary directory (uid in the name, mode 0700): a cache
  someone else can write is not one to memory-map batches from."""
  return os.path.join(tempfile.gettempdir(), f"mlm_jax_data_index-{os.getuid()}")


def _private(folder: str) -> None:
  """Create `folder` as 0700, or check that the existing one is this user's and closed to others."""
  os.makedirs(folder, mode=0o700, exist_ok=True)
  st = os.stat(folder)
  if st.st_uid != os.getuid():
    raise DataError(f"{folder}: the token store's index cache belongs to uid {st.st_uid}, not to you "
                    f"(uid {os.getuid()}); remove it or give the run a workdir (its data_index is used)")
  if st.st_mode & 0o077:
    os.chmod(folder, 0o700)


def cache_dir_for(workdir: str) -> str:
  """WORKDIR/data_index for a local workdir. A gs:// workdir gets a local folder instead: the index
  is memory-mapped, which needs a local file, and being a pure function of (store, config) it can
  be built by each host on its own."""
  return default_cache_dir() if paths.is_remote(workdir) else os.path.join(workdir, "data_index")


def index_folder(cache_dir: str, key: dict) -> str:
  name = hashlib.sha256(json.dumps(dict(key, v=INDEX_VERSION), sort_keys=True).encode())
  return os.path.join(cache_dir, name.hexdigest()[:24])


def load(folder: str, names=_ARRAYS) -> dict:
  return {k: np.load(os.path.join(folder, k + ".npy"), mmap_mode="r") for k in names}


def check_packing(index: dict, lens: np.ndarray, seq_len: int, packing: str = "segmented") -> None:
  """ValueError unless `index` is a packing index of documents of `lens` into rows of `seq_len`:
  every piece inside its document (concat: inside the document with its BOS and EOS, the coordinates
  `_concat` writes), row pointers covering the pieces in order, rows that fit."""
  doc, start, length, ptr, tokens = (np.asarray(index[k]) for k in _ARRAYS)
  if not (doc.ndim == start.ndim == length.ndim == ptr.ndim == tokens.ndim == 1):
    raise ValueError("arrays are not 1-D")
  if not (doc.size == start.size == length.size and ptr.size == tokens.size + 1 and ptr.size >= 1):
    raise ValueError("array lengths disagree")
  if ptr[0] != 0 or ptr[-1] != doc.size or (np.diff(ptr) < 0).any():
    raise ValueError("row pointers do not cover the pieces in order")
  if doc.size and (doc.min() < 0 or doc.max() >= lens.size):
    raise ValueError("a piece names a document the store does not have")
  wrapped = 2 if packing == "concat" else 0
  if doc.size and ((start < 0).any() or (length < 0).any() or (start + length > lens[doc] + wrapped).any()):
    raise ValueError("a piece reaches past its document")
  if tokens.size and (tokens.min() < 0 or tokens.max() > seq_len):
    raise ValueError(f"a row holds more than seq_len={seq_len} tokens")


def load_or_build(cache_dir: str, key: dict, make, names=_ARRAYS, check=None) -> dict:
  """The index for `key` from cache_dir (memory-mapped), building and saving it on a miss.

  A folder is used only if its key.json is `key` and its arrays load (and pass `check(arrays)`, which
  raises ValueError): otherwise it is rebuilt, with a warning. Written to a temporary folder and
  renamed, so concurrent hosts sharing a workdir and interrupted builds never leave a half index; the
  loser of a race uses the winner's.
  """
  folder = index_folder(cache_dir, key)
  why = _untrusted(folder, key, names, check)
  if why is None:
    return load(folder, names)
  if why:
    logging.warning("data: the index cache %s %s; building it again", folder, why)
  if cache_dir == default_cache_dir():
    _private(cache_dir)
  os.makedirs(cache_dir, exist_ok=True)
  arrays = make()
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir)
  for k, a in arrays.items():
    np.save(os.path.join(tmp, k + ".npy"), a)
  with open(os.path.join(tmp, "key.json"), "w", encoding="utf-8") as f:
    json.dump(key, f, sort_keys=True)
  if why:   # an untrusted folder of this name: out of the way first
    shutil.rmtree(folder, ignore_errors=True)
  try:
    os.replace(tmp, folder)
  except OSError:  # another process finished first: same content
    shutil.rmtree(tmp, ignore_errors=True)
  return load(folder, names)


def _untrusted(folder: str, key: dict, names, check) -> str | None:
  """None if `folder` holds the index for `key`; '' if there is none; else why it is not trusted."""
  try:
    with open(os.path.join(folder, "key.json"), encoding="utf-8") as f:
      saved = json.load(f)
  except FileNotFoundError:
    return ""
  except (OSError, ValueError) as e:
    return f"has an unreadable key.json ({type(e).__name__})"
  if saved != json.loads(json.dumps(key)):
    return "has a key.json for another index"
  try:
    arrays = load(folder, names)
    if check is not None:
      check(arrays)
  except (OSError, ValueError, EOFError) as e:
    return f"is damaged ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
  return None


def quotas(weights, block: int = MIX_BLOCK) -> np.ndarray:
  """Largest-remainder counts of `block` rows for these probabilities, each >= 1 if p > 0."""
  w = np.asarray(weights, np.float64)
  exact = w * block
  q = np.floor(exact).astype(np.int64)
  q[(w > 0) & (q == 0)] = 1
  rest = block - q.sum()
  if rest > 0:
    q[np.argsort(-(exact - np.floor(exact)), kind="stable")[:rest]] += 1
  while q.sum() > block:  # minimum-one bumps overshot: take from the largest
    q[np.argmax(q)] -= 1
  return q


def mix_pattern(q: np.ndarray):
  """(source of each slot, rank of the slot within its source) for one mixing block."""
  src = np.repeat(np.arange(q.size), q)
  rank = np.arange(src.size) - np.repeat(np.cumsum(q) - q, q)
  order = np.lexsort((src, (rank + 0.5) / q[src]))
  return src[order], rank[order]
