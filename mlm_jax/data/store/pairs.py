"""Sentence pairs for next-sentence prediction (BERT) and sentence-order prediction (ALBERT).

Pairs come from the lines of token-store documents (`--doc_format=blank_line`); everything random about
row k is a hash of (seed, source, epoch, chunk), so a resumed run sees the same pairs. One pair a row,
padded, with `sentence_labels` (0 = in order). The recipe: docs/design_notes.md#pairs.
"""
from __future__ import annotations

import hashlib

import numpy as np

from mlm_jax.data import specs
from mlm_jax.data.store import index as store_index
from mlm_jax.data.store import loader
from mlm_jax.errors import DataError

TASKS = ("nsp", "sop")
FEATURES = loader.FEATURES + ("token_type_ids", "sentence_labels")
INDEX_VERSION = 2
_ARRAYS = ("chunk_doc", "chunk_first", "chunk_end", "chunk_tokens", "doc_sentences", "counts")
_READ = 2048   # documents per read while building the index


def specials(layout: str) -> int:
  """Special tokens around a pair: [CLS] A [SEP] B [SEP] = 3, <s> A </s></s> B </s> = 4."""
  return 3 if layout == "bert" else 4


def sentences(doc) -> tuple[np.ndarray, np.ndarray]:
  """(starts, ends) token offsets of a document's non-empty lines."""
  ends = np.asarray(doc.line_ends, np.int64)
  starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
  keep = ends > starts
  return starts[keep], ends[keep]


def chunks(lengths, budget: int) -> list[tuple[int, int]]:
  """Whole-sentence chunks [first, end) of >= 2 sentences filling `budget` tokens (a document of
  >= 2 sentences); a lone last sentence joins the chunk before it."""
  out, start, tokens = [], 0, 0
  for k, n in enumerate(lengths):
    tokens += int(n)
    if tokens >= budget and k - start >= 1:
      out.append((start, k + 1))
      start, tokens = k + 1, 0
  m = len(lengths)
  if start < m:
    if m - start >= 2 or not out:
      out.append((start, m))
    else:
      out[-1] = (out[-1][0], m)
  return out


def build_index(store, name: str, split: str, budget: int) -> dict:
  """One pass over the documents' line ends (O(tokens) once per store, seq_len; then cached)."""
  lens = store.lengths(name, split)
  n = int(lens.size)
  doc_sentences = np.zeros(n, np.int32)
  c_doc, c_first, c_end, c_tokens = [], [], [], []
  for lo in range(0, n, _READ):
    for i, d in enumerate(store.read(name, split, np.arange(lo, min(n, lo + _READ))), lo):
      s, e = sentences(d)
      doc_sentences[i] = s.size
      if s.size < 2:
        continue
      for a, b in chunks(e - s, budget):
        c_doc.append(i)
        c_first.append(a)
        c_end.append(b)
        c_tokens.append(int(e[b - 1] - s[a]))
  single = int((doc_sentences < 2).sum())
  return dict(chunk_doc=np.asarray(c_doc, np.int64), chunk_first=np.asarray(c_first, np.int32),
              chunk_end=np.asarray(c_end, np.int32), chunk_tokens=np.asarray(c_tokens, np.int64),
              doc_sentences=doc_sentences,
              counts=np.asarray([n, single, len(c_doc)], np.int64))


def uniforms(seed: int, salt: int, epoch: int, chunk: int) -> np.ndarray:
  """8 floats in [0, 1), a pure function of (seed, source, epoch, chunk)."""
  h = hashlib.blake2b(repr((seed, salt, epoch, chunk)).encode(), digest_size=64).digest()
  return np.frombuffer(h, "<u8").astype(np.float64) / 2.0 ** 64


def truncate(la: int, lb: int, budget: int, u_a: float, u_b: float) -> tuple[slice, slice]:
  """The parts of A and B kept so that |A| + |B| <= budget: the longer side is cut until it fits
  (BERT's truncate_seq_pair, in closed form), each side losing its excess from the front or the
  back by a coin."""
  if la + lb <= budget:
    return slice(0, la), slice(0, lb)
  if min(la, lb) <= budget // 2:
    na, nb = (budget - lb, lb) if la > lb else (la, budget - la)
  else:
    big, small = budget - budget // 2, budget // 2
    na, nb = (big, small) if la >= lb else (small, big)
  cut = lambda length, n, u: slice(length - n, length) if u < 0.5 else slice(0, n)
  return cut(la, na, u_a), cut(lb, nb, u_b)


def make_pair(kind: str, doc, first: int, end: int, u: np.ndarray, budget: int, other=None):
  """(A ids, A word starts, B ids, B word starts, label) of one chunk; `other` = the random
  document for an NSP negative (drawn by the caller from u[2])."""
  s, e = sentences(doc)
  n = end - first
  a_end = first + 1 + int(u[1] * (n - 1))
  label = int(u[0] < 0.5)
  span = lambda d, lo, hi: (d.ids[lo:hi], d.word_starts[lo:hi])
  a = span(doc, s[first], e[a_end - 1])
  if kind == "nsp" and label:
    os_, oe = sentences(other)
    if os_.size:
      k0 = int(u[3] * os_.size)
      need = max(budget - a[0].size, 1)
      k1 = k0 + 1 + int(np.searchsorted(oe[k0:] - os_[k0], need, side="left").clip(max=os_.size - k0 - 1))
      b = span(other, os_[k0], oe[k1 - 1])
    else:
      b = span(other, 0, other.ids.size)
  else:
    b = span(doc, s[a_end], e[end - 1])
    if kind == "sop" and label:
      a, b = b, a
  ka, kb = truncate(a[0].size, b[0].size, budget, u[4], u[5])
  return a[0][ka], a[1][ka], b[0][kb], b[1][kb], label


class _PairStream(loader._Stream):
  """One source of one store as chunks (rows) for pairs; its epoch permutation is _Stream's."""

  def __init__(self, label, store, name, split, seq_len, layout, seed, salt, cache_dir):
    self.label, self.store, self.name, self.split = label, store, name, split
    self._init_order(seed, salt)
    self.budget = seq_len - specials(layout)
    key = dict(kind="sentence_pairs", store=store.fingerprint, source=name, split=split,
               budget=self.budget, pair_index_version=INDEX_VERSION)
    self.index = store_index.load_or_build(cache_dir, key,
                                           lambda: build_index(store, name, split, self.budget), _ARRAYS)
    self.rows = int(self.index["chunk_doc"].shape[0])
    self.num_docs, self.single_docs, _ = (int(x) for x in self.index["counts"])
    if split == "train" and self.rows == 0 and self.num_docs:
      raise DataError(f"store source {label!r}: none of its {self.num_docs} documents has two lines, so no "
                      "sentence pair can be built; prepare it with --doc_format=blank_line")
    self.tokens = int(store.source(name)["tokens" if split == "train" else "eval_tokens"])
    # for the logged per-source tokens: a pair holds its chunk, cut to the budget, plus the specials
    # (an NSP negative's B differs in length; exact on average for the in-order half)
    kept = np.minimum(self.index["chunk_tokens"], self.budget)
    self.tokens_per_row = float(kept.mean()) + specials(layout) if self.rows else 0.0


class PairPipeline(loader.StorePipeline):
  """Batches of sentence pairs from token stores: the store pipeline's row addressing, mixing,
  curricula and O(1) state, with one pair per row instead of packed documents."""

  def __init__(self, data_config, task: str, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, split: str = "train", cache_dir=None):
    """`task`: 'nsp' or 'sop', the pair task the caller's objective trains (its input kind)."""
    if task not in TASKS:
      raise DataError(f"sentence pair task {task!r}: expected one of {TASKS}")
    if not specs.is_store(data_config):
      raise DataError(f"{task.upper()} sentence pairs are read from a token store: prepare the corpus "
                      "with tools/prepare_data.py --doc_format=blank_line and set data.sources=('store:DIR',)")
    self.kind = task
    self._pairs = dict(nsp_negatives=0, sop_swapped=0, pairs=0)
    super().__init__(data_config, batch_size, seed, process_index, process_count, split, cache_dir)

  def _stream(self, label, store, name, c, seed, salt, cache_dir):
    layout = store.manifest["tokenizer"].get("layout", "xlmr")
    self.layout = layout
    return _PairStream(label, store, name, self.split, c.seq_len, layout, seed, salt, cache_dir)

  def _key(self) -> dict:
    return dict(super()._key(), objective=self.kind, pair_index_version=INDEX_VERSION)

  def rows_for(self, src: np.ndarray, packed: np.ndarray, epochs: np.ndarray) -> list:
    """(label, A ids, A word starts, B ids, B word starts) for rows given as (stream, chunk, epoch)."""
    out = [None] * len(src)
    for i in np.unique(src):
      if i < 0:
        continue
      st = self.streams[i]
      sel = np.nonzero(src == i)[0]
      chunk = packed[sel]
      doc_ids = st.index["chunk_doc"][chunk]
      us = [uniforms(self.seed, st.salt, int(e), int(c)) for e, c in zip(epochs[sel], chunk)]
      n_docs = st.num_docs
      others = []
      for d, u in zip(doc_ids.tolist(), us):
        o = int(u[2] * max(n_docs - 1, 1))
        others.append(o + (o >= d) if n_docs > 1 else d)
      wanted = np.unique(np.concatenate([doc_ids, others]))
      docs = dict(zip(wanted.tolist(), st.store.read(st.name, st.split, wanted)))
      for r, c, d, o, u in zip(sel.tolist(), chunk.tolist(), doc_ids.tolist(), others, us):
        first, end = int(st.index["chunk_first"][c]), int(st.index["chunk_end"][c])
        out[r] = make_pair(self.kind, docs[d], first, end, u, st.budget, docs[o])
    return out

  def _make_assembler(self):
    return None   # pairs are built by _assemble below, in the training process (no store_workers)

  def _build(self, first: int) -> tuple:
    """As the store pipeline's (pure; worker threads call it), with each row's epoch: its pair is
    drawn per epoch."""
    rows = first + np.arange(self.batch_size, dtype=np.int64)
    src, packed = self._locate(rows)
    epochs = np.zeros_like(rows)
    if self.split == "train":
      k = self._positions(rows)[1]
      epochs = k // np.asarray([s.rows for s in self.streams], np.int64)[src]
    return self._assemble(src, packed, epochs)

  def _assemble(self, src: np.ndarray, packed: np.ndarray, epochs: np.ndarray) -> tuple:
    n, s = len(src), self.seq_len
    out = {k: np.zeros((n, s), np.int32) for k in FEATURES if k != "sentence_labels"}
    out["sentence_labels"] = np.zeros((n,), np.int32)
    out["input_ids"][:] = self.pad_id
    tokens = np.zeros(len(self.streams), np.int64)
    pairs = dict.fromkeys(self._pairs, 0)
    bos, eos = self.bos_id, self.eos_id
    for r, pair in enumerate(self.rows_for(src, packed, epochs)):
      if pair is None:
        continue
      a, a_ws, b, b_ws, label = pair
      if self.layout == "bert":
        ids = np.concatenate([[bos], a, [eos], b, [eos]])
        ws = np.concatenate([[1], a_ws, [1], b_ws, [1]])
        types = np.concatenate([np.zeros(a.size + 2), np.ones(b.size + 1)])
      else:
        ids = np.concatenate([[bos], a, [eos, eos], b, [eos]])
        ws = np.concatenate([[1], a_ws, [1, 1], b_ws, [1]])
        types = np.zeros(ids.size)
      m = ids.size
      ws[1] = ws[m - 1 - b.size] = 1   # a cut may start a side mid-word: its first token opens a word
      out["input_ids"][r, :m] = ids
      out["word_starts"][r, :m] = ws
      out["token_type_ids"][r, :m] = types
      out["segment_ids"][r, :m] = 1
      out["positions"][r, :m] = np.arange(m)
      out["sentence_labels"][r] = label
      tokens[src[r]] += m
      pairs["pairs"] += 1
      pairs["nsp_negatives" if self.kind == "nsp" else "sop_swapped"] += label
    return out, dict(tokens=tokens, pairs=pairs)

  def _count(self, tally: dict) -> None:
    super()._count(tally)
    for k, v in tally["pairs"].items():
      self._pairs[k] += v

  def rewind(self) -> None:
    super().rewind()
    self._pairs = dict.fromkeys(self._pairs, 0)

  def stats(self) -> dict:
    """The store pipeline's, plus per source the documents skipped (one sentence) and this process's
    pair counts."""
    out = super().stats()
    for s in self.streams:
      out["sources"][s.label].update(docs=s.num_docs, single_sentence_docs_skipped=s.single_docs, chunks=s.rows)
    out["pairs"] = dict(self._pairs, single_sentence_docs_skipped=sum(s.single_docs for s in self.streams))
    return out
