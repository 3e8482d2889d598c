"""Pseudo-log-likelihood (Salazar et al., 2020): per sentence, the sum over its tokens of log p(token | rest).

Each sentence becomes masked copies, the variant deciding which pieces a copy masks and which it scores
(Kauf & Ivanova, 2023): `token`, one copy per non-special piece, that piece masked; `whole_word`, one
copy per word, all its pieces masked and scored; `word_l2r` (their PLL-word-l2r), one copy per piece,
that piece and the rest of its word to the right masked, that piece scored. Copies of many sentences are
packed into fixed rows with segment ids and positions restarting per copy, as pretraining rows are, so
one compiled step on the run's mesh scores any set with no padding but the tails of rows
(docs/design_notes.md#pll).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from mlm_jax.data import packing
from mlm_jax.errors import NoMaskedLM, UserError
from mlm_jax.model import sharding

# Rows kept open for best fit while packing: enough that nearly every slot holds a token.
OPEN_ROWS = 8
MIN_ROOM = 3       # a row with room for less is closed: no copy is shorter (BOS, a piece, EOS)
ROW_LEN = 128      # tokens a row by default: copies of 8-25 tokens (BLiMP's) fill ~90% of it
SLOT_MULTIPLE = 8
# Masked-copy tokens packed at a time (a sentence of n tokens has at most n copies of n): the host holds
# ~100 MB of rows whatever the set's size (all of BLiMP packed at once held 2.7 GB for the demo's model).
CHUNK_TOKENS = 1 << 22
VARIANTS = ("token", "whole_word", "word_l2r")


@dataclasses.dataclass
class Packed:
  """Rows of masked copies and, per row, the slots predicted: their position, true id and sentence."""
  input_ids: np.ndarray       # [rows, row_len]
  segment_ids: np.ndarray     # [rows, row_len], 0 = padding
  positions: np.ndarray       # [rows, row_len], restarting at each copy
  slot_positions: np.ndarray  # [rows, slots]
  slot_targets: np.ndarray    # [rows, slots]
  slot_sentence: np.ndarray   # [rows, slots], -1 = an empty slot

  @property
  def real_tokens(self) -> int:
    return int((self.segment_ids > 0).sum())


class WordStarts:
  """The tokenizer's word-start rule as pretraining applies it (data/store/prepare.py, data/text/tf_packing.py):
  a piece starts a word by its table entry, or after a piece that ends in whitespace; the first always."""

  def __init__(self, tok):
    self.table = np.asarray(tok.word_start_table(), np.int32)
    after = tok.after_space_table()
    self.after = None if after is None else np.asarray(after, np.int32)

  def __call__(self, ids: np.ndarray) -> np.ndarray:
    ws = self.table[ids].copy()
    if self.after is not None and len(ids) > 1:
      ws[1:] = np.maximum(ws[1:], self.after[ids[:-1]])
    if len(ws):
      ws[0] = 1
    return ws


def check_variant(variant: str, where: str = "pll") -> str:
  if variant not in VARIANTS:
    raise UserError(f"{where}={variant!r}: expected one of {', '.join(VARIANTS)}")
  return variant


def unit_masks(ids: np.ndarray, special: np.ndarray, starts: np.ndarray | None,
               variant: str = "token") -> tuple[np.ndarray, np.ndarray]:
  """(masked, scored), each [copies, len] bool: the positions each copy masks and those whose log p it
  adds. A word (`starts` given for the word variants) is the pieces from a word start to the next start
  or special token."""
  body = np.flatnonzero(~special)
  one = np.zeros((len(body), len(ids)), bool)
  one[np.arange(len(body)), body] = True
  if variant == "token":
    return one, one
  word = np.cumsum((starts > 0) | special) - 1     # word index of each position
  if variant == "whole_word":
    words = np.unique(word[body])
    whole = (word[None, :] == words[:, None]) & ~special[None, :]
    return whole, whole
  right = (word[None, :] == word[body][:, None]) & (np.arange(len(ids))[None, :] >= body[:, None])
  return right & ~special[None, :], one


def longest(row_len: int, max_len: int) -> int:
  """The most tokens (with BOS/EOS) a sentence may have: the model's positions (0 = any), at most a row."""
  return min(max_len or row_len, row_len)


def pack(sentences: list, row_len: int, tok, variant: str = "token", one_per_row: bool = False,
         max_len: int = 0, min_slots: int = 0) -> Packed:
  """The masked copies (of `variant`, VARIANTS) of `sentences` (id lists with BOS/EOS) in rows of `row_len`
  tokens; a sentence may have at most `max_len` tokens (the model's positions; 0 = row_len): positions
  restart in each copy. Rows have at least `min_slots` prediction slots (a multiple of SLOT_MULTIPLE)."""
  max_len = longest(row_len, max_len)
  special_ids = np.asarray(tok.special_ids)
  starts_of = WordStarts(tok) if check_variant(variant) != "token" else None
  # Best fit of the copies over the last OPEN_ROWS rows (the oldest closed first); one_per_row closes
  # each row after its first copy. Copies of a sentence that land in one row are one block.
  rows = packing.Window(row_len, OPEN_ROWS, min_room=row_len + 1 if one_per_row else MIN_ROOM,
                        oldest_first=True)
  copies_in = collections.Counter()   # copies placed so far in each row
  blocks = []   # (row, offset, first segment, copies [k, L], scored [k, L], ids, sentence)
  for s, sentence in enumerate(sentences):
    ids = np.asarray(sentence, np.int32)
    if len(ids) > max_len:
      raise UserError(f"sentence {s} is {len(ids)} tokens long with BOS/EOS; the model reads at most {max_len}")
    special = np.isin(ids, special_ids)
    masked, scored = unit_masks(ids, special, starts_of(ids) if starts_of else None, variant)
    _, offsets, row_of, _ = rows.place([len(ids)] * len(masked))
    done = 0
    for r, run in itertools.groupby(row_of):
      k = len(list(run))
      blocks.append((r, offsets[done], copies_in[r] + 1,
                     np.where(masked[done:done + k], tok.mask_id, ids[None, :]), scored[done:done + k], ids, s))
      copies_in[r] += k
      done += k
  n_rows = rows.rows
  input_ids = np.full((n_rows, row_len), tok.pad_id, np.int32)
  segment_ids = np.zeros((n_rows, row_len), np.int32)
  positions = np.zeros((n_rows, row_len), np.int32)
  slots = [[] for _ in range(n_rows)]
  for r, offset, seg, copies, m, ids, s in blocks:
    k, length = copies.shape
    span = slice(offset, offset + k * length)
    input_ids[r, span] = copies.reshape(-1)
    segment_ids[r, span] = np.repeat(np.arange(seg, seg + k, dtype=np.int32), length)
    positions[r, span] = np.tile(np.arange(length, dtype=np.int32), k)
    j, p = np.nonzero(m)
    slots[r].append(np.stack([offset + j * length + p, ids[p], np.full_like(p, s)], axis=1))
  per_row = [np.concatenate(x) if x else np.zeros((0, 3), np.int64) for x in slots]
  width = max([len(x) for x in per_row] + [1, min_slots])
  width = -(-width // SLOT_MULTIPLE) * SLOT_MULTIPLE
  slot = np.zeros((n_rows, width, 3), np.int32)
  slot[..., 2] = -1
  for r, x in enumerate(per_row):
    slot[r, :len(x)] = x
  return Packed(input_ids, segment_ids, positions, slot[..., 0], slot[..., 1], slot[..., 2])


def encode(tok, texts: list) -> list:
  """`<s> pieces </s>` id lists of texts, as pretraining rows hold a document."""
  return [[tok.bos_id] + ids + [tok.eos_id] for ids in tok.encode_batch(list(texts))]


def max_len(model_cfg) -> int:
  """The longest sentence a model reads: its learned positions (0 = any that fits a row)."""
  if model_cfg.get("positions", "learned") != "learned":
    return 0
  return int(model_cfg.max_position_embeddings) - int(model_cfg.position_offset)


def check_mlm_head(model_cfg, where: str) -> None:
  if not model_cfg.mlm_head:
    raise NoMaskedLM(f"{where}: the model has no MLM head (an ELECTRA discriminator); pseudo-log-likelihood "
                    "needs the masked LM (the generator)")


class Scorer:
  """PLL of sentences under a masked LM given as (graphdef, params[, path to the masked-LM module]).

  `rows` rows per step (rounded up to the mesh's batch parallelism), `row_len` tokens a row, sentences
  of at most `max_len` tokens (the model's positions; 0 = row_len), masked copies of `variant` (VARIANTS).
  One compile per (rows, row_len, slots) shape; `one_per_row` gives the unpacked reference. `shift`: the
  model predicts a masked token at t from position t - shift (its objective's `prediction_shift`: GPT-BERT's
  masked next-token prediction, 1)."""

  def __init__(self, graphdef, tok, row_len: int, *, rows: int = 64, path: str = "", variant: str = "token",
               mesh=None, one_per_row: bool = False, max_len: int = 0, chunk_tokens: int = CHUNK_TOKENS,
               shift: int = 0):
    from flax import nnx
    self.tok, self.row_len, self.one_per_row = tok, int(row_len), one_per_row
    self.variant = check_variant(variant)
    self.max_len, self.chunk_tokens = int(max_len), int(chunk_tokens)
    self.slots = 0     # the widest rows packed so far: later chunks keep that compiled shape
    self.mesh = mesh
    parallel = 1 if mesh is None else sharding._axis_size(mesh, sharding.BATCH_AXES)
    self.rows = -(-int(rows) // parallel) * parallel

    def logprobs(params, ids, seg, pos, slot_pos, slot_target):
      model = nnx.merge(graphdef, params)
      for name in filter(None, path.split(".")):
        model = getattr(model, name)
      hidden = model(ids, seg, pos)
      # a copy's first token (BOS) is never masked: t - shift stays in the copy
      picked = jnp.take_along_axis(hidden, jnp.maximum(slot_pos - shift, 0)[..., None], axis=1)
      logp = jax.nn.log_softmax(model.mlm_logits(picked).astype(jnp.float32), axis=-1)
      return jnp.take_along_axis(logp, slot_target[..., None], axis=-1)[..., 0]

    if mesh is None:
      self.step = jax.jit(logprobs)
      self.place = jnp.asarray
    else:
      batch_sh = sharding.batch_sharding(mesh)
      self.step = jax.jit(logprobs, out_shardings=sharding.replicated(mesh))
      self.place = lambda a: jax.make_array_from_callback(a.shape, batch_sh, lambda idx: a[idx])

  @property
  def longest(self) -> int:
    return longest(self.row_len, self.max_len)

  def pack(self, sentences: list) -> Packed:
    p = pack(sentences, self.row_len, self.tok, self.variant, self.one_per_row, self.max_len, self.slots)
    self.slots = p.slot_positions.shape[1]
    return p

  def __call__(self, params, sentences: list, progress=None) -> np.ndarray:
    """float64 [sentences]: the PLL of each id list (with BOS/EOS), packed `chunk_tokens` at a time.
    `progress(done, total)`, if given, after each step: the sentences scored so far (a chunk's in proportion
    to its rows done), of all."""
    total = np.zeros(len(sentences), np.float64)
    start, tokens = 0, 0
    for i, sentence in enumerate(sentences):
      if tokens and tokens + len(sentence) ** 2 > self.chunk_tokens:
        self._score(params, sentences[start:i], total[start:i], progress, start, len(sentences))
        start, tokens = i, 0
      tokens += len(sentence) ** 2
    self._score(params, sentences[start:], total[start:], progress, start, len(sentences))
    return total

  def _score(self, params, sentences: list, total: np.ndarray, progress=None, before: int = 0,
             of: int = 0) -> None:
    """Adds the PLL of each sentence into `total` (a view of the caller's array); `progress` as in __call__,
    `before` sentences scored ahead of these, `of` in all."""
    p = self.pack(sentences)
    for b in range(0, len(p.input_ids), self.rows):
      part = [a[b:b + self.rows] for a in (p.input_ids, p.segment_ids, p.positions, p.slot_positions,
                                           p.slot_targets, p.slot_sentence)]
      short = self.rows - len(part[0])
      if short:   # the last step: empty rows (segment 0, no slots) keep the compiled shape
        part = [np.concatenate([a, np.full((short,) + a.shape[1:], -1 if i == 5 else 0, a.dtype)])
                for i, a in enumerate(part)]
      lp = np.asarray(jax.device_get(self.step(params, *[self.place(a) for a in part[:5]])), np.float64)
      keep = part[5] >= 0
      np.add.at(total, part[5][keep], lp[keep])
      if progress is not None:
        progress(before + len(sentences) * min(b + self.rows, len(p.input_ids)) // len(p.input_ids), of)

  def score_texts(self, params, texts: list) -> np.ndarray:
    return self(params, encode(self.tok, texts))
