"""Masking statistics on real text (botchan, tokenized by a real sentencepiece model)."""
import jax
import numpy as np
import pytest

from mlm_jax.objectives import masking
from mlm_jax.config.defaults import default_config

import textdata


@pytest.fixture(scope="module")
def real_batch(shared_data):
  sp, lines = textdata.load(shared_data)
  batch = textdata.packed_batches(sp, lines + lines[::-1], seq_len=128)
  assert (batch["segment_ids"] > 0).sum() > 100_000
  return batch


def _cfg(mode="token", **kw):
  c = default_config().masking
  c.mode = mode
  c.mask_id = textdata.MASK
  c.special_ids = textdata.SPECIALS
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def _run(batch, cfg, seed=0, step=0):
  key = jax.random.fold_in(jax.random.key(seed), step)
  fn = jax.jit(lambda b, k: masking.mask_batch(b, k, cfg, textdata.VOCAB))
  return jax.tree.map(np.asarray, fn(batch, key))


def _selected(batch, out):
  """[B, S] bool of selected positions, from the slots; checks slots are unique."""
  sel = np.zeros(batch["input_ids"].shape, bool)
  for i in range(sel.shape[0]):
    pos = out["masked_positions"][i][out["masked_weights"][i] > 0]
    assert len(set(pos.tolist())) == len(pos)
    sel[i, pos] = True
  return sel


def _candidates(batch):
  ids = batch["input_ids"]
  return (batch["segment_ids"] > 0) & ~np.isin(ids, textdata.SPECIALS + (textdata.MASK,))


@pytest.mark.parametrize("mode", ["token", "whole_word", "span", "span_uniform"])
def test_rate_specials_and_labels(real_batch, mode):
  out = _run(real_batch, _cfg(mode))
  sel = _selected(real_batch, out)
  cand = _candidates(real_batch)
  assert not (sel & ~cand).any(), "a special or padding token was selected"
  rate = sel.sum() / cand.sum()
  assert abs(rate - 0.15) < 0.005, rate
  # Labels are the original tokens at the slots; unused slots carry weight 0.
  w = out["masked_weights"] > 0
  orig = np.take_along_axis(real_batch["input_ids"], out["masked_positions"], axis=1)
  np.testing.assert_array_equal(out["masked_labels"][w], orig[w])
  assert out["masked_positions"].shape[1] == masking.max_predictions(_cfg(mode), 128) == 24
  # Nothing outside the selection changes.
  np.testing.assert_array_equal(out["input_ids"][~sel], real_batch["input_ids"][~sel])


def test_80_10_10(real_batch):
  out = _run(real_batch, _cfg())
  sel = _selected(real_batch, out)
  orig, new = real_batch["input_ids"][sel], out["input_ids"][sel]
  n = sel.sum()
  masked = (new == textdata.MASK).mean()
  kept = (new == orig).mean()
  rand = ((new != textdata.MASK) & (new != orig)).mean()
  assert abs(masked - 0.8) < 0.01 and abs(rand - 0.1) < 0.01 and abs(kept - 0.1) < 0.01, (n, masked, rand, kept)
  # Random replacements are real, non-special tokens.
  replaced = new[(new != textdata.MASK) & (new != orig)]
  assert not np.isin(replaced, textdata.SPECIALS + (textdata.MASK,)).any()
  assert replaced.min() >= 0 and replaced.max() < textdata.VOCAB


def test_whole_word_never_splits_a_word(real_batch):
  out = _run(real_batch, _cfg("whole_word"))
  sel = _selected(real_batch, out)
  ws, cand = real_batch["word_starts"], _candidates(real_batch)
  words_checked = 0
  for i in range(sel.shape[0]):
    word = np.cumsum((ws[i] > 0) | ~cand[i])
    for w in np.unique(word[sel[i]]):
      members = word == w
      assert sel[i][members].all(), f"row {i}: word {w} partly masked"
      words_checked += 1
  assert words_checked > 5000
  # Some multi-token words were masked whole (otherwise the test proves nothing).
  multi = sum(((np.cumsum(ws[i] > 0) == w).sum() > 1) for i in range(50) for w in np.unique(np.cumsum(ws[i] > 0)[sel[i]]))
  assert multi > 20


def test_span_lengths_follow_clipped_geometric(shared_data):
  sp, lines = textdata.load(shared_data)
  # Long documents, so spans are rarely cut by a document end or the budget.
  batch = textdata.packed_batches(sp, lines, seq_len=512, lines_per_doc=20)
  cfg = _cfg("span")
  out = _run(batch, cfg)
  sel = _selected(batch, out)
  runs = []
  for row in sel:
    edges = np.diff(np.concatenate([[0], row.astype(int), [0]]))
    runs += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
  runs = np.asarray(runs)
  assert len(runs) > 2000
  expected = np.asarray(masking.span_length_probs(cfg.span_p, cfg.span_max))
  hist = np.bincount(runs, minlength=cfg.span_max + 1)[1:] / len(runs)
  assert runs.max() <= cfg.span_max
  # The last span of each sequence is cut to the remaining budget (as SpanBERT does), which moves a
  # little mass to short spans: hence 3 points per length and 10% on the mean.
  np.testing.assert_allclose(hist, expected, atol=0.03)
  mean_expected = (np.arange(1, cfg.span_max + 1) * expected).sum()
  assert abs(runs.mean() - mean_expected) / mean_expected < 0.10, (runs.mean(), mean_expected)


def test_span_uniform_masks_whole_spans_of_one_to_three_and_decides_80_10_10_per_span(real_batch):
  """GPT-BERT's masking: each row is cut into spans of 1..span_max tokens (a special token ends one); the
  selection is whole spans but the one that reaches the budget (a prefix of it), and a span's tokens are all
  masked, all replaced or all kept, 80/10/10 over spans."""
  cfg = _cfg("span_uniform", span_max=3, mask_rate=0.3)
  n = 128
  rows = {k: v[:n] for k, v in real_batch.items()}
  out = _run(rows, cfg)
  sel, cand = _selected(rows, out), _candidates(rows)
  slots = masking.max_predictions(cfg, 128)
  # each row's spans, from the key mask_batch gives its selection (_run's key at step 0, folded with the row)
  k_sel = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 0), i), 3)[0])
  spans = np.asarray(jax.jit(jax.vmap(lambda k, c: masking._select_uniform_spans(k, c, 0.3, slots, 3)[1]))(
      k_sel(np.arange(n)), cand))
  kinds, cut = [], 0
  for i in range(n):
    span = spans[i]
    lengths = np.bincount(span[cand[i]])
    assert lengths.max() <= 3
    new, orig = out["input_ids"][i], rows["input_ids"][i]
    for s in np.unique(span[sel[i]]):
      members = (span == s) & cand[i]
      if not sel[i][members].all():   # the span cut at the budget: a prefix of it
        cut += 1
        assert np.flatnonzero(members)[:sel[i][members].sum()].tolist() == np.flatnonzero(sel[i] & members).tolist()
      chosen = sel[i] & members
      kind = np.where(new[chosen] == textdata.MASK, 0, np.where(new[chosen] == orig[chosen], 2, 1))
      assert (kind == kind[0]).all() or (kind[0] != 0 and (kind != 0).all()), (i, s, kind)   # a random draw may equal
      kinds.append(kind[0])
  assert 0 < cut <= n and len(kinds) > 2000
  share = np.bincount(kinds, minlength=3) / len(kinds)
  assert abs(share[0] - 0.8) < 0.03 and abs(share[1] - 0.1) < 0.03 and abs(share[2] - 0.1) < 0.03, share


def test_deterministic_per_key_and_step(real_batch):
  small = {k: v[:64] for k, v in real_batch.items()}
  a, b = _run(small, _cfg(), step=3), _run(small, _cfg(), step=3)
  c = _run(small, _cfg(), step=4)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert (a["masked_positions"] != c["masked_positions"]).any()


def test_mask_of_an_example_does_not_depend_on_its_batch(real_batch):
  """Row i of a batch gets the same mask as the same row masked alone with example_offset=i."""
  small = {k: v[:16] for k, v in real_batch.items()}
  cfg, key = _cfg(), jax.random.key(7)
  whole = masking.mask_batch(small, key, cfg, textdata.VOCAB)
  tail = masking.mask_batch({k: v[8:] for k, v in small.items()}, key, cfg, textdata.VOCAB, example_offset=8)
  np.testing.assert_array_equal(np.asarray(whole["input_ids"][8:]), np.asarray(tail["input_ids"]))
  np.testing.assert_array_equal(np.asarray(whole["masked_positions"][8:]), np.asarray(tail["masked_positions"]))


def test_bad_config_is_named():
  c = _cfg(mode="words")
  with pytest.raises(ValueError, match="masking.mode='words'"):
    masking.check_config(c, textdata.VOCAB)
  c = _cfg(mask_id=-1)
  with pytest.raises(ValueError, match="masking.mask_id=-1"):
    masking.check_config(c, textdata.VOCAB)
