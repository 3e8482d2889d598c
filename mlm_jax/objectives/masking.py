"""Dynamic MLM masking on device: token, whole-word, span (SpanBERT) and uniform-span (GPT-BERT)
selection, then 80/10/10.

`mask_batch(batch, key, cfg)` is pure and runs inside the jitted step; example i draws from
`fold_in(key, i)`, i its index in the global batch, so any mesh and any resume give the same masks.
Output: a fixed number of prediction slots per sequence (docs/design_notes.md#masking).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections

from mlm_jax.config import choices, curricula
from mlm_jax.errors import ConfigError

MODES = choices.CHOICES["masking.mode"]


# Prediction slots are rounded up to a multiple of this per platform, whichever was faster
# (measurements: docs/design_notes.md#masking); gpu and an unknown platform (None) keep 8, the
# multiple tensor-core tiles prefer.
SLOT_MULTIPLE = {"cpu": 1, "gpu": 8, "tpu": 1, None: 8}


def max_predictions(cfg: ml_collections.ConfigDict, seq_len: int, platform: str | None = None) -> int:
  """ceil(mask_rate * seq_len) rounded up to SLOT_MULTIPLE[platform] (unless set explicitly).

  With a mask-rate schedule the rate is the schedule's maximum, so the step compiles once.

  The config-resolution step writes this into masking.max_predictions for the mesh's platform, so
  the jitted step (which cannot know whether it is compiled for a TPU on a CPU host) uses it as is.
  """
  if cfg.max_predictions > 0:
    return min(int(cfg.max_predictions), seq_len)
  multiple = SLOT_MULTIPLE.get(platform, 8)
  rate = curricula.max_mask_rate(cfg)
  return min(seq_len, multiple * math.ceil(math.ceil(rate * seq_len) / multiple))


def check_slots(cfg: ml_collections.ConfigDict, seq_len: int) -> None:
  """An explicit masking.max_predictions below ceil(max rate * seq_len) would cap the rate silently
  (BERT's 20 slots, set for seq 128, hold 3.9% of a 512-token row): refused, with the number needed."""
  needed = min(seq_len, math.ceil(curricula.max_mask_rate(cfg) * seq_len))
  if 0 < cfg.max_predictions < needed:
    raise ConfigError(f"masking.max_predictions={cfg.max_predictions} holds {cfg.max_predictions / seq_len:.1%} of "
                      f"a {seq_len}-token row, below the mask rate {curricula.max_mask_rate(cfg):g}: set it to "
                      f"at least {needed}, or to 0 (sized from the rate)")


def check_config(cfg: ml_collections.ConfigDict, vocab_size: int) -> None:
  """Fail early, with the key named, on settings the masking cannot honour."""
  choices.check("masking.mode", cfg.mode)
  if not 0.0 < cfg.mask_rate < 1.0:
    raise ConfigError(f"masking.mask_rate={cfg.mask_rate}: expected a fraction in (0, 1)")
  choices.check("masking.mask_rate_schedule_mode", cfg.mask_rate_schedule_mode)
  _, rates = curricula.mask_rate_phases(cfg)
  if rates.size and not ((rates > 0) & (rates < 1)).all():
    raise ConfigError(f"masking.mask_rate_schedule={tuple(cfg.mask_rate_schedule)}: expected rates in (0, 1)")
  if cfg.mask_token_prob < 0 or cfg.random_token_prob < 0 or cfg.mask_token_prob + cfg.random_token_prob > 1:
    raise ConfigError(f"masking.mask_token_prob={cfg.mask_token_prob} + random_token_prob="
                      f"{cfg.random_token_prob}: expected non-negative and summing to at most 1")
  if not 0 <= cfg.mask_id < vocab_size:
    raise ConfigError(f"masking.mask_id={cfg.mask_id}: expected an id in [0, {vocab_size}) "
                      "(set it from the tokenizer's mask id)")
  if cfg.mode in ("span", "span_uniform") and int(cfg.span_max) < 1:
    raise ConfigError(f"masking.span_max={cfg.span_max}: expected a span length of at least 1")
  bad = [i for i in cfg.special_ids if not 0 <= i < vocab_size]
  if bad:
    raise ConfigError(f"masking.special_ids has ids outside [0, {vocab_size}): {bad}")


def _candidates(input_ids, segment_ids, special_ids):
  """Real, non-special tokens: the only ones that may be selected."""
  ok = segment_ids > 0
  for s in special_ids:
    ok &= input_ids != s
  return ok


def _budget(candidates, rate, num_slots):
  n = candidates.sum().astype(jnp.float32)
  return jnp.minimum(jnp.round(rate * n), num_slots).astype(jnp.int32)


def _select_tokens(key, cand, rate, num_slots):
  """Exactly round(rate * n_candidates) tokens, uniformly at random."""
  score = jnp.where(cand, jax.random.uniform(key, cand.shape), -1.0)
  _, idx = jax.lax.top_k(score, num_slots)
  take = jnp.arange(num_slots) < _budget(cand, rate, num_slots)
  return jnp.zeros(cand.shape, bool).at[idx].set(take)


def _select_words(key, cand, word_starts, rate, num_slots):
  """Whole words in random order until the budget; the word that crosses it is kept when that is closer.

  A word is the run of tokens from a word-start flag to the next one; it is a candidate only if
  all its tokens are, so a word is masked whole or not at all.
  """
  s = cand.shape[0]
  starts = (word_starts > 0) | ~cand
  word = jnp.cumsum(starts) - 1                                   # word index of each token
  length = jnp.zeros(s, jnp.int32).at[word].add(1)
  word_ok = (jnp.ones(s, jnp.int32).at[word].min(cand.astype(jnp.int32)) > 0) & (length > 0)
  score = jnp.where(word_ok, jax.random.uniform(key, (s,)), -1.0)
  order = jnp.argsort(-score)
  sorted_len = jnp.where(word_ok[order], length[order], 0)
  total = jnp.cumsum(sorted_len)
  budget = _budget(cand, rate, num_slots)
  prev = total - sorted_len
  keep_sorted = (prev < budget) & ((total <= budget) | (total - budget <= budget - prev)) & (total <= num_slots)
  keep_sorted &= sorted_len > 0
  keep_word = jnp.zeros(s, bool).at[order].set(keep_sorted)
  return keep_word[word] & cand


def span_length_probs(p: float, max_len: int):
  """SpanBERT's span-length distribution: geometric(p) clipped (renormalized) at max_len."""
  lengths = jnp.arange(1, max_len + 1)
  probs = p * (1 - p) ** (lengths - 1)
  return probs / probs.sum()


def _select_spans(key, cand, rate, num_slots, p, max_len):
  """Contiguous spans of geometric length at random free places until the budget is used.

  Spans never touch (one unselected token between them) and never cross a special token or a
  document boundary, so each selected run is exactly one sampled span. A sampled length that does
  not fit anywhere is skipped; the last span is cut to the remaining budget.
  """
  s = cand.shape[0]
  budget = _budget(cand, rate, num_slots)
  log_probs = jnp.log(span_length_probs(p, max_len))
  idx = jnp.arange(s)

  def body(i, carry):
    sel, used = carry
    k_len, k_pos = jax.random.split(jax.random.fold_in(key, i))
    want = jax.random.categorical(k_len, log_probs) + 1
    length = jnp.minimum(want, budget - used)
    left = jnp.concatenate([jnp.zeros(1, bool), sel[:-1]])
    right = jnp.concatenate([sel[1:], jnp.zeros(1, bool)])
    free = (cand & ~sel & ~left & ~right).astype(jnp.int32)
    csum = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(free)])   # csum[j] = sum(free[:j])
    end = jnp.minimum(idx + length, s)
    fits = (csum[end] - csum[idx] == length) & (idx + length <= s)
    score = jnp.where(fits, jax.random.uniform(k_pos, (s,)), -1.0)
    start = jnp.argmax(score)
    ok = (score[start] >= 0) & (length > 0)
    new = ok & (idx >= start) & (idx < start + length)
    return sel | new, used + jnp.where(ok, length, 0)

  sel, _ = jax.lax.fori_loop(0, num_slots, body, (jnp.zeros(s, bool), jnp.int32(0)))
  return sel


def _select_uniform_spans(key, cand, rate, num_slots, max_len):
  """GPT-BERT's span masking: the row cut into spans of 1..max_len tokens (uniform; a special token or
  padding ends a span), spans taken in a random order until round(rate * n) tokens (the last one cut
  there). Returns (selected, span index of each token)."""
  s = cand.shape[0]
  k_len, k_order = jax.random.split(key)
  lengths = jax.random.randint(k_len, (s,), 1, max_len + 1)
  starts = jnp.zeros(s, bool).at[jnp.cumsum(lengths) - lengths].set(True, mode="drop")
  after_boundary = jnp.concatenate([jnp.zeros(1, bool), ~cand[:-1]])
  span = jnp.cumsum(starts | ~cand | after_boundary) - 1
  score = jnp.where(cand, jax.random.uniform(k_order, (s,))[span], -1.0)
  _, idx = jax.lax.top_k(score, num_slots)   # equal scores (one span) keep their order
  take = jnp.arange(num_slots) < _budget(cand, rate, num_slots)
  return jnp.zeros(s, bool).at[idx].set(take), span


def _slots(selected, num_slots):
  """Positions of the selected tokens in increasing order, padded to `num_slots`."""
  s = selected.shape[0]
  score = jnp.where(selected, s - jnp.arange(s), 0)
  vals, pos = jax.lax.top_k(score, num_slots)
  used = vals > 0
  return jnp.where(used, pos, 0), used


def _random_tokens(key, shape, vocab_size, special_ids):
  """Uniform over the non-special ids: draw from [0, V - n_special), then step over the specials."""
  r = jax.random.randint(key, shape, 0, vocab_size - len(special_ids))
  for s in sorted(special_ids):
    r = r + (r >= s)
  return r


def mask_example(key, input_ids, segment_ids, word_starts, cfg, vocab_size, num_slots, rate=None):
  """One sequence: select, corrupt 80/10/10, and emit prediction slots (`rate`: default cfg.mask_rate; the
  trainer's step passes its value, config/step_values.py)."""
  rate = cfg.mask_rate if rate is None else rate
  k_sel, k_how, k_rand = jax.random.split(key, 3)
  cand = _candidates(input_ids, segment_ids, tuple(cfg.special_ids) + (cfg.mask_id,))
  group = jnp.arange(input_ids.shape[0])   # tokens that share the 80/10/10 draw: span_uniform's spans
  if cfg.mode == "token":
    selected = _select_tokens(k_sel, cand, rate, num_slots)
  elif cfg.mode == "whole_word":
    selected = _select_words(k_sel, cand, word_starts, rate, num_slots)
  elif cfg.mode == "span":
    selected = _select_spans(k_sel, cand, rate, num_slots, cfg.span_p, cfg.span_max)
  else:
    selected, group = _select_uniform_spans(k_sel, cand, rate, num_slots, cfg.span_max)
  positions, used = _slots(selected, num_slots)
  u = jax.random.uniform(k_how, input_ids.shape)[group]
  special = tuple(sorted(set(tuple(cfg.special_ids) + (cfg.mask_id,))))
  rand = _random_tokens(k_rand, input_ids.shape, vocab_size, special)
  corrupted = jnp.where(u < cfg.mask_token_prob, cfg.mask_id,
                        jnp.where(u < cfg.mask_token_prob + cfg.random_token_prob, rand, input_ids))
  new_ids = jnp.where(selected, corrupted, input_ids)
  return new_ids, positions, jnp.where(used, input_ids[positions], 0), used.astype(jnp.float32)


def mask_batch(batch, key, cfg: ml_collections.ConfigDict, vocab_size: int, example_offset=0, rate=None):
  """Masks a batch; `example_offset` is the global index of row 0 (for per-host or per-microbatch slices).
  `rate` (a traced scalar: the step's mask rate or its schedule's) overrides cfg.mask_rate.

  Returns a new batch dict with corrupted `input_ids` and masked_positions / masked_labels / masked_weights
  [B, P] (docs/design_notes.md#masking).
  """
  ids = batch["input_ids"]
  b, s = ids.shape
  num_slots = max_predictions(cfg, s)
  word_starts = batch.get("word_starts")
  if word_starts is None:
    word_starts = jnp.ones_like(ids)
  rows = example_offset + jnp.arange(b)
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(rows)
  fn = lambda k, x, g, w: mask_example(k, x, g, w, cfg, vocab_size, num_slots, rate)
  new_ids, positions, labels, weights = jax.vmap(fn)(keys, ids, batch["segment_ids"], word_starts)
  out = dict(batch)
  out.update(input_ids=new_ids, masked_positions=positions, masked_labels=labels, masked_weights=weights)
  return out
