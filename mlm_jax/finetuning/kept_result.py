"""When a kept result (a fine-tuned seed, a zero-shot score) may be read back instead of computed again:
only when what it was computed from is unchanged. These are the parts of that record common to the
fine-tuning suite (suite.py) and the zero-shot tasks (zeroshot_suite.py), and the line that says what changed.
"""
from __future__ import annotations

import hashlib
import json
import os

from mlm_jax.workdir import checkpoints


def digest(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def init_identity(init_from: str, random_init: bool) -> dict:
  """What identifies the model a result was computed from: the folder, its newest checkpoint step (the one
  fine-tuning starts from; None for a transformers folder), a hash of its config.json, and whether its
  weights were replaced by a random init."""
  with open(os.path.join(init_from, "config.json"), "rb") as f:
    init_config = hashlib.sha256(f.read()).hexdigest()[:16]
  return dict(init_from=os.path.realpath(init_from), init_step=checkpoints.newest_step(init_from),
              init_config=init_config, random_init=bool(random_init))


def zeroshot_identity(init_from: str, random_init: bool, pll: str, dtype: str = "") -> dict:
  """What a zero-shot score depends on besides its pairs: the model (`init_identity`), the PLL variant
  that scored it (evaluation/pll.py VARIANTS) and a compute dtype chosen over the model's, so scores of
  different variants or dtypes are never mixed."""
  identity = dict(init_identity(init_from, random_init), pll=pll)
  if dtype:   # only when chosen: results kept without it were computed in the model's own dtype
    identity["dtype"] = dtype
  return identity


def differs(saved: dict, now: dict) -> str:
  """'init_step 2 -> 4, config' : what changed since a result was saved (or its run started)."""
  keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
  plain = ("init_step", "mode", "random_init", "overrides", "pairs", "pll", "dtype")
  return ", ".join(f"{k} {saved.get(k)!r} -> {now.get(k)!r}" if k in plain else k for k in keys)
