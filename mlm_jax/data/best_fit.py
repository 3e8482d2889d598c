"""Best-fit packing of documents into rows over a bounded window of open rows (both input paths).

Each item goes into the open row with the least room that fits it, ties to the lowest slot, so rows depend
only on the items, never on their grouping into calls (rules, figures: docs/design_notes.md#best_fit).
"""
from __future__ import annotations

import array
import bisect
import heapq

MIN_ITEM = 2   # BOS + EOS of an empty document


class Window:
  """The open rows: `fill[slot]` tokens used (0 = a free slot); `row[slot]` its row number."""

  def __init__(self, seq_len: int, window: int, fill=None, row=None):
    if window < 1:
      raise ValueError(f"packing window {window}: need at least 1 open row")
    self.seq_len, self.window = seq_len, window
    self.fill = [0] * window if fill is None else [int(x) for x in fill]
    self.row = [-1] * window if row is None else [int(x) for x in row]
    self.rows = 1 + max(self.row)   # the next row number
    self.free = [k for k in range(window) if self.fill[k] == 0]
    self.buckets = {}               # room -> heap of slots with that room
    for k in range(window):
      if self.fill[k]:
        self.buckets.setdefault(seq_len - self.fill[k], []).append(k)
    self.rooms = sorted(self.buckets)   # room values with a non-empty bucket

  def _take(self, at: int) -> int:
    """The lowest slot of the at-th smallest room, removed from its bucket."""
    room = self.rooms[at]
    heap = self.buckets[room]
    slot = heapq.heappop(heap)
    if not heap:
      del self.buckets[room]
      self.rooms.pop(at)
    return slot

  def _close(self, slot: int, closed: list, at: int) -> None:
    closed.append((at, slot, self.row[slot]))
    self.fill[slot], self.row[slot] = 0, -1
    heapq.heappush(self.free, slot)

  def place(self, lengths) -> tuple:
    """Pack items of these lengths in order -> (slot of each, its offset in the row, row number of
    each, closes): closes lists (items placed before it, slot, row number) for each row closed,
    in order; a closed slot's content must be taken before the next item lands in it. The three
    per-item results are int64 arrays (8 bytes an item: a store source may have millions)."""
    s = self.seq_len
    slots, offsets, rows, closed = array.array("q"), array.array("q"), array.array("q"), []
    for i, n in enumerate(lengths):
      k = bisect.bisect_left(self.rooms, n)
      if k < len(self.rooms):
        slot = self._take(k)
      else:
        if not self.free:
          self._close(self._take(0), closed, i)
        slot = heapq.heappop(self.free)
        self.row[slot], self.rows = self.rows, self.rows + 1
      off = self.fill[slot]
      slots.append(slot)
      offsets.append(off)
      rows.append(self.row[slot])
      self.fill[slot] = off + n
      room = s - off - n
      if room < MIN_ITEM:
        self._close(slot, closed, i + 1)
      elif room in self.buckets:
        heapq.heappush(self.buckets[room], slot)
      else:
        self.buckets[room] = [slot]
        bisect.insort(self.rooms, room)
    return slots, offsets, rows, closed

  def open_slots(self) -> list:
    """Slots of the open rows, oldest row first (what a final flush emits, in this order)."""
    return sorted((k for k in range(self.window) if self.fill[k]), key=lambda k: self.row[k])
