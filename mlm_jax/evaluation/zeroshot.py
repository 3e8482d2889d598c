"""Zero-shot BLiMP: a minimal pair is right when PLL(good) > PLL(bad); a tie is wrong.

Ties count as errors because a model that gives every sentence one score must sit at 0, not at chance
(BabyLM 2025). For the same reason a pair with a sentence longer than the model reads (a 64-position
model meets 9 of the 67,000) is wrong, not skipped: every model is scored on the same pairs, and the
summary says how many (`too_long`). Accuracy overall is the mean over paradigms, as the paper reports it;
per phenomenon, the mean over its paradigms (docs/quality.md).
"""
from __future__ import annotations

import time

import numpy as np

from mlm_jax.evaluation import pll


def pair_correct(good: np.ndarray, bad: np.ndarray) -> np.ndarray:
  """bool per pair: strictly more likely good sentence (a tie is wrong)."""
  return np.asarray(good) > np.asarray(bad)


def summarize(paradigms: list, correct: dict) -> dict:
  """{'overall', 'phenomena': {term: acc}, 'paradigms': {UID: acc}, 'pairs'} from bool arrays per UID."""
  per = {p.name: float(np.mean(correct[p.name])) for p in paradigms}
  terms = {}
  for p in paradigms:
    terms.setdefault(p.phenomenon, []).append(per[p.name])
  return dict(overall=float(np.mean(list(per.values()))),
              phenomena={t: float(np.mean(v)) for t, v in sorted(terms.items())},
              paradigms=per, pairs=int(sum(len(p.good) for p in paradigms)))


def blimp(scorer: pll.Scorer, params, paradigms: list) -> dict:
  """The BLiMP summary of one masked LM: every sentence that fits the model scored by one Scorer call."""
  t0 = time.perf_counter()
  sentences = [s for p in paradigms for s in p.good + p.bad]
  ids = pll.encode(scorer.tok, sentences)
  fits = np.array([len(x) <= scorer.longest for x in ids], bool)
  scores = np.zeros(len(ids), np.float64)
  scores[fits] = scorer(params, [x for x, ok in zip(ids, fits) if ok])
  correct, too_long, at = {}, 0, 0
  for p in paradigms:
    n = len(p.good)
    both = fits[at:at + n] & fits[at + n:at + 2 * n]
    correct[p.name] = pair_correct(scores[at:at + n], scores[at + n:at + 2 * n]) & both
    too_long += int((~both).sum())
    at += 2 * n
  out = summarize(paradigms, correct)
  out.update(too_long=too_long, longest=scorer.longest)
  out["seconds"] = time.perf_counter() - t0
  out["sentences_per_second"] = len(sentences) / max(out["seconds"], 1e-9)
  return out
