"""The packing library's users on real text: the token store's index, the streaming pipeline and PLL's rows.

Each is checked against a straightforward reference written here (a list scan per item, no heaps, no
numpy) that states the rules the packers had before they shared the library. (Byte fingerprints of the
old packers' outputs were compared once, when the library replaced them; they depend on the pieces the
sentencepiece release trains, so they are not kept here.)
"""
import gzip

import numpy as np
import pytest

from mlm_jax.config import defaults
from mlm_jax.data import packing
from mlm_jax.data.store import index as store_index
from mlm_jax.data.text import sources
from mlm_jax.data.text import stream
from mlm_jax.evaluation import pll
from test_store import EN, tok  # noqa: F401  (tok: the store tests' tokenizer, 600 pieces of de + en)

DOCS = 4000

INDEX_CASES = [("segmented", "next", 0), ("segmented", "best", 1), ("segmented", "best", 16),
               ("segmented", "best", 256), ("concat", "next", 0)]
STREAM_CASES = [("segmented", "next", 0), ("segmented", "best", 16), ("segmented", "best", 256),
                ("concat", "next", 0)]

@pytest.fixture(scope="module")
def texts(shared_data):
  with gzip.open(shared_data / EN, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t")[1] for line in f][:DOCS]


# -- references ---------------------------------------------------------------------------------
def _ref_next_fit(sizes, seq_len) -> list:
  """Rows (lists of item numbers): an item that does not fit the row's rest starts the next row."""
  rows, fill = [], 0
  for i, n in enumerate(sizes):
    if not rows or fill + n > seq_len:
      rows.append([])
      fill = 0
    rows[-1].append(i)
    fill += n
  return rows


def _ref_best_fit(sizes, seq_len, window, min_room=2, oldest_first=False):
  """(closed, still open): [(row number, items)], closed in closing order, the open ones oldest first.

  Each item goes into the open row with the least room that fits it (ties: the lowest slot, or the
  oldest row); none fits: a new row (numbered in opening order) in the lowest free slot, after closing
  the fullest row (lowest slot first), or the oldest, when no slot is free; a row with room for less
  than min_room is closed."""
  slots = [None] * window           # [number, fill, items]
  closed, number = [], 0
  for i, n in enumerate(sizes):
    fits = [k for k in range(window) if slots[k] and seq_len - slots[k][1] >= n]
    order = (lambda k: (seq_len - slots[k][1], slots[k][0])) if oldest_first else (
        lambda k: (seq_len - slots[k][1], k))
    if fits:
      k = min(fits, key=order)
    else:
      if None not in slots:
        out = min(range(window), key=(lambda k: slots[k][0]) if oldest_first else order)
        closed.append((slots[out][0], slots[out][2]))
        slots[out] = None
      k = slots.index(None)
      slots[k] = [number, 0, []]
      number += 1
    slots[k][1] += n
    slots[k][2].append(i)
    if seq_len - slots[k][1] < min_room:
      closed.append((slots[k][0], slots[k][2]))
      slots[k] = None
  return closed, sorted((s[0], s[2]) for s in slots if s)


def test_references_match_the_library_on_random_items():
  """The library against the references on items of every size, in one call and in groups."""
  rng = np.random.default_rng(0)
  for seq_len in (8, 64):
    sizes = rng.integers(2, seq_len + 1, 3000)
    starts = packing.next_fit(sizes, seq_len).tolist()
    assert starts == [row[0] for row in _ref_next_fit(sizes.tolist(), seq_len)]
    for window, min_room, oldest in ((1, 2, False), (16, 2, False), (8, 3, True), (3, seq_len + 1, True)):
      closed, still_open = _ref_best_fit(sizes.tolist(), seq_len, window, min_room, oldest)
      want = {i: r for r, items in closed + still_open for i in items}
      win, rows = packing.Window(seq_len, window, min_room=min_room, oldest_first=oldest), []
      for a in range(0, sizes.size, 250):
        rows += list(win.place(sizes[a:a + 250].tolist())[2])
      assert rows == [want[i] for i in range(sizes.size)]
      assert [win.row[k] for k in win.open_slots()] == [r for r, _ in still_open]


# -- the token store's index ------------------------------------------------------------------------
def _index(tok, texts, seq_len, packing_, fit, window):
  lens = np.array([len(x) for x in tok.encode_batch(texts)], np.int64)
  order = store_index.permute(np.arange(lens.size), 3, 0, 0, lens.size)
  return lens, order, store_index.build(lens, seq_len, packing_, order, fit, window)


def _ref_index_rows(lens, order, seq_len, packing_, fit, window) -> list:
  """Rows as lists of pieces (document, start, length), as the index should hold them."""
  if packing_ == "concat":   # a stream of (document, position with BOS = 0), cut every seq_len
    flat = [(d, p) for d in order.tolist() for p in range(int(lens[d]) + 2)]
    rows = []
    for a in range(0, len(flat), seq_len):
      pieces = []
      for d, p in flat[a:a + seq_len]:
        if pieces and pieces[-1][0] == d:
          pieces[-1][2] += 1
        else:
          pieces.append([d, p, 1])
      rows.append([tuple(x) for x in pieces])
    return rows
  body = seq_len - 2
  pieces = [(d, a, min(body, int(lens[d]) - a)) for d in order.tolist()
            for a in range(0, max(int(lens[d]), 1), body)]
  sizes = [n + 2 for _, _, n in pieces]
  if fit == "next":
    groups = _ref_next_fit(sizes, seq_len)
  else:
    closed, still_open = _ref_best_fit(sizes, seq_len, window)
    tail = sorted(i for _, items in still_open for i in items)
    if len(tail) > 1:   # the rows left open are packed again, longest item first
      by_size = sorted(tail, key=lambda i: -sizes[i])
      again = _ref_best_fit([sizes[i] for i in by_size], seq_len, len(tail))
      groups = [g for _, g in sorted(closed)] + [[by_size[j] for j in g] for _, g in sorted(again[0] + again[1])]
    else:
      groups = [g for _, g in sorted(closed + still_open)]
  return [[pieces[i] for i in sorted(g)] for g in groups]


@pytest.mark.parametrize("seq_len", [24, 64])
@pytest.mark.parametrize("case", INDEX_CASES, ids=lambda c: "/".join(map(str, c)))
def test_store_index_is_the_reference(tok, texts, seq_len, case):
  lens, order, ix = _index(tok, texts, seq_len, *case)
  ptr = ix["row_ptr"].tolist()
  got = [list(zip(*(ix[k][a:b].tolist() for k in ("piece_doc", "piece_start", "piece_len"))))
         for a, b in zip(ptr[:-1], ptr[1:])]
  assert got == _ref_index_rows(lens, order, seq_len, *case)
  wrapped = 0 if case[0] == "concat" else 2
  assert ix["row_tokens"].tolist() == [sum(n + wrapped for _, _, n in row) for row in got]


# -- the streaming pipeline ---------------------------------------------------------------------------
def _stream_config(shared_data, packing_, fit, window):
  c = defaults.data_defaults()
  c.sources = (f"en=tsv:1:{shared_data / EN}",)
  c.eval_percent, c.shuffle_buffer, c.shuffle_files = 0.0, 0, False
  c.seq_len, c.tokenize_batch, c.packing, c.packing_fit = 48, 256, packing_, fit
  if window:
    c.packing_window = window
  return c


def _stream(shared_data, tok, packing_, fit, window):
  c = _stream_config(shared_data, packing_, fit, window)
  return c, list(stream.build_dataset(c, tok, 8, 0, repeat=False).as_numpy_iterator())


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: "/".join(map(str, c)))
def test_streaming_rows_are_the_reference(shared_data, tok, case):
  c, batches = _stream(shared_data, tok, *case)
  rows = {k: np.concatenate([b[k] for b in batches]) for k in stream.FEATURES}
  real = rows["segment_ids"] > 0
  n = int(real.any(axis=1).sum())
  assert real[:n].any(axis=1).all() and not real[n:].any()      # padding rows only to fill the last batch
  docs = []
  for src in sources.parse_sources(c.sources, c.tfds_data_dir):
    docs += [d.decode("utf-8") for b in src.documents().batch(4096).as_numpy_iterator() for d in b]
  bos, eos, s = tok.bos_id, tok.eos_id, c.seq_len
  if case[0] == "concat":
    want = [t for ids in tok.encode_batch(docs) for t in [bos] + ids + [eos]]
    assert rows["input_ids"][real].tolist() == want and real.reshape(-1)[:len(want)].all()
    return
  got = [[tuple(ids[seg == k].tolist()) for k in range(1, seg.max() + 1)]
         for ids, seg in zip(rows["input_ids"][:n], rows["segment_ids"][:n])]
  groups = []   # the chunks (BOS/EOS included) of each tokenizer call, in order
  for a in range(0, len(docs), c.tokenize_batch):
    groups.append([(bos, *ids[i:i + s - 2], eos) for ids in tok.encode_batch(docs[a:a + c.tokenize_batch])
                   for i in range(0, len(ids), s - 2)])
  if case[1] == "next":   # each call's chunks packed on their own
    want = [[g[i] for i in row] for g in groups for row in _ref_next_fit([len(x) for x in g], s)]
  else:                   # one best fit over the whole stream, rows in the order they close
    chunks = [x for g in groups for x in g]
    closed, still_open = _ref_best_fit([len(x) for x in chunks], s, case[2])
    want = [[chunks[i] for i in items] for _, items in closed + still_open]
  assert got == want


# -- PLL ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("one_per_row", [False, True])
@pytest.mark.parametrize("variant", pll.VARIANTS)
def test_pll_rows_are_the_reference(tok, texts, variant, one_per_row):
  sentences = pll.encode(tok, texts[:400])
  p = pll.pack(sentences, 128, tok, variant, one_per_row)
  starts = pll.WordStarts(tok)
  copies = []   # every masked copy, in order
  for ids in sentences:
    ids = np.asarray(ids, np.int32)
    masked, _ = pll.unit_masks(ids, np.isin(ids, tok.special_ids), starts(ids), variant)
    copies += [np.where(m, tok.mask_id, ids).tolist() for m in masked]
  closed, still_open = _ref_best_fit([len(x) for x in copies], 128, pll.OPEN_ROWS,
                                     129 if one_per_row else 3, oldest_first=True)
  assert len(p.input_ids) == len(closed) + len(still_open)
  for r, items in closed + still_open:
    want = [t for i in items for t in copies[i]]
    seg = [k + 1 for k, i in enumerate(items) for _ in copies[i]]
    assert p.input_ids[r, :len(want)].tolist() == want and (p.input_ids[r, len(want):] == tok.pad_id).all()
    assert p.segment_ids[r, :len(seg)].tolist() == seg and not p.segment_ids[r, len(seg):].any()
