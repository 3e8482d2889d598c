"""Zero-shot minimal pairs (BLiMP, CLAMS, a user's files): a pair is right when PLL(good) > PLL(bad); a tie is wrong.

Ties count as errors because a model that gives every sentence one score must sit at 0, not at chance
(BabyLM 2025). For the same reason a pair with a sentence longer than the model reads (a 64-position
model meets 9 of BLiMP's 67,000) is wrong, not skipped: every model is scored on the same pairs, and the
summary says how many (`too_long`). A set's accuracy is the share of its pairs right; a phenomenon's the
mean over its sets; a group's (CLAMS: a language; a pairs task: a file) the mean over its sets; overall,
the mean over groups, or over sets where there are none (BLiMP: over paradigms, as the paper reports it;
docs/quality.md). `pll` names the PLL variant (evaluation/pll.py) that scored them. `verdicts` keeps every
pair's outcome (a set's pairs in file order, "1" right, "0" wrong), so two models scored on the same pairs
compare pair by pair, not only by their means.
"""
from __future__ import annotations

import time

import numpy as np

from mlm_jax.evaluation import pll


def pair_correct(good: np.ndarray, bad: np.ndarray) -> np.ndarray:
  """bool per pair: strictly more likely good sentence (a tie is wrong)."""
  return np.asarray(good) > np.asarray(bad)


def verdicts(correct: dict) -> dict:
  """{set name: one character a pair, "1" right, "0" wrong} from bool arrays per set name."""
  return {name: (np.asarray(c, np.uint8) + ord("0")).tobytes().decode("ascii") for name, c in correct.items()}


def _means(sets: list, per: dict, key) -> dict:
  out = {}
  for s in sets:
    out.setdefault(key(s), []).append(per[s.name])
  return {k: float(np.mean(v)) for k, v in out.items()}


def summarize(sets: list, correct: dict) -> dict:
  """{'overall', 'phenomena': {term: acc}, 'paradigms': {set name: acc}, 'pairs'} from bool arrays per set
  name; sets with groups add 'groups': {group: acc} and 'by_group': {group: {term: acc}}."""
  per = {s.name: float(np.mean(correct[s.name])) for s in sets}
  terms = _means(sets, per, lambda s: s.phenomenon)
  out = dict(phenomena=dict(sorted(terms.items())), paradigms=per, pairs=int(sum(len(s.good) for s in sets)))
  if any(s.group for s in sets):
    out["groups"] = _means(sets, per, lambda s: s.group)
    out["by_group"] = {}
    for s in sets:
      out["by_group"].setdefault(s.group, {})[s.phenomenon] = per[s.name]
    out["overall"] = float(np.mean(list(out["groups"].values())))
  else:
    out["overall"] = float(np.mean(list(per.values())))
  return out


def score_pairs(scorer: pll.Scorer, params, sets: list, progress=None) -> dict:
  """The summary of one masked LM on pair sets: every sentence that fits the model scored by one Scorer call
  (`progress(done, total)` in sentences, as pll.Scorer calls it)."""
  t0 = time.perf_counter()
  sentences = [x for s in sets for x in s.good + s.bad]
  ids = pll.encode(scorer.tok, sentences)
  fits = np.array([len(x) <= scorer.longest for x in ids], bool)
  scores = np.zeros(len(ids), np.float64)
  scores[fits] = scorer(params, [x for x, ok in zip(ids, fits) if ok], progress)
  correct, too_long, at = {}, 0, 0
  for s in sets:
    n = len(s.good)
    both = fits[at:at + n] & fits[at + n:at + 2 * n]
    correct[s.name] = pair_correct(scores[at:at + n], scores[at + n:at + 2 * n]) & both
    too_long += int((~both).sum())
    at += 2 * n
  out = summarize(sets, correct)
  out.update(too_long=too_long, longest=scorer.longest, pll=scorer.variant, verdicts=verdicts(correct))
  out["seconds"] = time.perf_counter() - t0
  out["sentences_per_second"] = len(sentences) / max(out["seconds"], 1e-9)
  return out
