"""What resolution derived, kept apart from what the user set.

A user's config says what they chose (`model.vocab_size=0`: the tokenizer's; `attention_impl='auto'`);
resolution (training/resolve.py) derives the values a run uses (the tokenizer's 32000, 'splash'). The
resolved config is the user's with the derived values over it; `split` recovers the derived part, which
WORKDIR/config.json keeps next to the user's config (workdir/files.py), and `merge` puts them together
again when the file is read.
"""
from __future__ import annotations

import json

import ml_collections

# Fields only resolution sets (from the tokenizer): the user-facing defaults do not hold them.
FROM_TOKENIZER = ("masking.mask_id", "masking.special_ids")


def as_json(config) -> dict:
  """A ConfigDict (or dict) as config.json holds it: tuples as lists, only JSON types."""
  if isinstance(config, ml_collections.ConfigDict):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(config))


def split(user, resolved) -> dict:
  """The fields of `resolved` that `user` does not hold or holds with another value (nested dicts)."""
  return _diff(as_json(user), as_json(resolved))


def _diff(user: dict, resolved: dict) -> dict:
  out = {}
  for key, value in resolved.items():
    mine = user.get(key)
    if isinstance(value, dict) and isinstance(mine, dict):
      inner = _diff(mine, value)
      if inner:
        out[key] = inner
    elif key not in user or mine != value:
      out[key] = value
  return out


def merge(user: dict, derived: dict) -> dict:
  """`user` with `derived` over it (the resolved config), as a new dict."""
  out = dict(user)
  for key, value in derived.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      out[key] = merge(out[key], value)
    else:
      out[key] = value
  return out
