"""Packing: which item goes into which row, one implementation per algorithm (Python and numpy, no TensorFlow).

An item is a run of tokens kept whole in a row: a document or a chunk of one with its BOS and EOS, or a
masked copy of a sentence. `next_fit`, `Window` (best fit) and `concat_pieces` decide the rows; the
callers lay the tokens out: the token store's index (data/store/index.py), the tf.data adapter
(data/text/tf_packing.py) and pseudo-log-likelihood (evaluation/pll.py). Rules and figures:
docs/design_notes.md#packing-library.
"""
from __future__ import annotations

import array
import bisect
import heapq

import numpy as np

MIN_ITEM = 2   # BOS + EOS of an empty document


def next_fit(lengths, seq_len: int) -> np.ndarray:
  """The first item of each row (int64) of a next-fit packing: one open row; an item that does not fit
  what is left of it starts the next row."""
  starts, fill = [0], 0
  for i, n in enumerate(np.asarray(lengths).tolist()):
    if fill + n > seq_len:
      starts.append(i)
      fill = 0
    fill += n
  return np.asarray(starts if len(lengths) else [], np.int64)


def concat_pieces(lengths, seq_len: int) -> tuple:
  """RoBERTa's FULL-SENTENCES: the items as one stream cut every seq_len tokens, an item split across
  rows -> (item, start in the item, length, row) of each piece, in stream order."""
  lengths = np.asarray(lengths, np.int64)
  cum = np.concatenate([[0], np.cumsum(lengths)])
  first_row, last_row = cum[:-1] // seq_len, (cum[1:] - 1) // seq_len
  n_pieces = last_row - first_row + 1
  item = np.repeat(np.arange(lengths.size), n_pieces)
  row = np.repeat(first_row, n_pieces) + (np.arange(item.size) -
                                          np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces))
  lo = np.maximum(cum[item], row * seq_len)
  hi = np.minimum(cum[item + 1], (row + 1) * seq_len)
  return item, lo - cum[item], hi - lo, row


class Window:
  """Best fit over `window` open rows: `fill[slot]` tokens used (0 = a free slot), `row[slot]` its row
  number (rows numbered 0.. in the order they open).

  Each item goes into the open row with the least room that fits it; one that fits none opens a row,
  closing one first if no slot is free; a row left with room for less than `min_room` is closed. Ties
  and the row closed for a new one: the lowest slot and the fullest row, or with `oldest_first` (PLL's
  rule) the oldest row both times. The rows depend only on the items, never on their grouping into calls.
  """

  def __init__(self, seq_len: int, window: int, fill=None, row=None, *, min_room: int = MIN_ITEM,
               oldest_first: bool = False):
    if window < 1:
      raise ValueError(f"packing window {window}: need at least 1 open row")
    self.seq_len, self.window, self.min_room, self.oldest_first = seq_len, window, min_room, oldest_first
    self.fill = [0] * window if fill is None else [int(x) for x in fill]
    self.row = [-1] * window if row is None else [int(x) for x in row]
    self.rows = 1 + max(self.row)   # the next row number
    self.free = [k for k in range(window) if self.fill[k] == 0]
    self.slot_of = {self.row[k]: k for k in range(window) if self.fill[k]}   # oldest_first: row -> slot
    self.buckets = {}               # room -> heap of the slots (oldest_first: rows) with that room
    for k in range(window):
      if self.fill[k]:
        heapq.heappush(self.buckets.setdefault(seq_len - self.fill[k], []), self.row[k] if oldest_first else k)
    self.rooms = sorted(self.buckets)   # room values with a non-empty bucket

  def _take(self, at: int, key=None) -> int:
    """The slot of `key` (None: the first) in the bucket of the at-th smallest room, removed from it."""
    room = self.rooms[at]
    heap = self.buckets[room]
    if key is None:
      key = heapq.heappop(heap)
    else:
      heap.remove(key)
      heapq.heapify(heap)
    if not heap:
      del self.buckets[room]
      self.rooms.pop(at)
    return self.slot_of.pop(key) if self.oldest_first else key

  def _close(self, slot: int, closed: list, at: int) -> None:
    closed.append((at, slot, self.row[slot]))
    self.fill[slot], self.row[slot] = 0, -1
    heapq.heappush(self.free, slot)

  def place(self, lengths) -> tuple:
    """Pack items of these lengths in order -> (slot of each, its offset in the row, row number of
    each, closes): closes lists (items placed before it, slot, row number) for each row closed,
    in order; a closed slot's content must be taken before the next item lands in it. The three
    per-item results are int64 arrays (8 bytes an item: a store source may have millions)."""
    s, min_room, oldest_first = self.seq_len, self.min_room, self.oldest_first
    fill, row, rooms, buckets = self.fill, self.row, self.rooms, self.buckets
    slots, offsets, rows, closed = array.array("q"), array.array("q"), array.array("q"), []
    for i, n in enumerate(lengths):
      k = bisect.bisect_left(rooms, n)
      if k < len(rooms):
        slot = self._take(k)
      else:
        if not self.free:   # close the fullest row, or the oldest
          oldest = min(self.slot_of) if oldest_first else None
          at = bisect.bisect_left(rooms, s - fill[self.slot_of[oldest]]) if oldest_first else 0
          self._close(self._take(at, oldest), closed, i)
        slot = heapq.heappop(self.free)
        row[slot], self.rows = self.rows, self.rows + 1
      off = fill[slot]
      slots.append(slot)
      offsets.append(off)
      rows.append(row[slot])
      fill[slot] = off + n
      room = s - off - n
      if room < min_room:
        self._close(slot, closed, i + 1)
        continue
      key = slot
      if oldest_first:
        key = row[slot]
        self.slot_of[key] = slot
      if room in buckets:
        heapq.heappush(buckets[room], key)
      else:
        buckets[room] = [key]
        bisect.insort(rooms, room)
    return slots, offsets, rows, closed

  def open_slots(self) -> list:
    """Slots of the open rows, oldest row first (what a final flush emits, in this order)."""
    return sorted((k for k in range(self.window) if self.fill[k]), key=lambda k: self.row[k])
