"""Scanned <-> unscanned parameter layouts, so checkpoints move between `model.scan_layers` settings.

Both directions work on the dotted paths of tree_paths.py; the names and shapes of each layout,
and why ModernBERT's layer 0 stays unrolled: docs/design_notes.md#scan_layout.
"""
from __future__ import annotations

import re

import numpy as np
import ml_collections

from mlm_jax.model.encoder import abstract_model, layer_layout as layout
from mlm_jax.model.tree_paths import fill, flatten


def unscan_flat(flat: dict, cfg: ml_collections.ConfigDict) -> dict:
  """{scanned dotted name: array} -> {unscanned dotted name: array}."""
  a, n, g = layout(cfg)
  out = {}
  for name, x in flat.items():
    lead = re.fullmatch(r"lead_layers\.(\d+)\.(.+)", name)
    grouped = re.fullmatch(r"layer_groups\.layers\.(\d+)\.(.+)", name)
    tail = re.fullmatch(r"tail_layers\.(\d+)\.(.+)", name)
    if lead:
      out[f"layers.{lead[1]}.{lead[2]}"] = x
    elif grouped:
      j, rest = int(grouped[1]), grouped[2]
      out.update({f"layers.{a + k * g + j}.{rest}": x[k] for k in range(n)})
    elif tail:
      out[f"layers.{a + n * g + int(tail[1])}.{tail[2]}"] = x
    else:
      out[name] = x
  return out


def scan_flat(flat: dict, cfg: ml_collections.ConfigDict) -> dict:
  """{unscanned dotted name: array} -> {scanned dotted name: array} (stacked as numpy)."""
  a, n, g = layout(cfg)
  out, stacks = {}, {}
  for name, x in flat.items():
    layer = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if not layer:
      out[name] = x
      continue
    i, rest = int(layer[1]), layer[2]
    if i < a:
      out[f"lead_layers.{i}.{rest}"] = x
    elif i < a + n * g:
      stacks.setdefault(f"layer_groups.layers.{(i - a) % g}.{rest}", [None] * n)[(i - a) // g] = x
    else:
      out[f"tail_layers.{i - a - n * g}.{rest}"] = x
  out.update({name: np.stack([np.asarray(x) for x in xs]) for name, xs in stacks.items()})
  return out


def _with_scan(cfg: ml_collections.ConfigDict, scan: bool) -> ml_collections.ConfigDict:
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.scan_layers = scan
  return out


def unscan_params(params, cfg: ml_collections.ConfigDict):
  """Params of a scanned model (`cfg.scan_layers` True) -> those of the unscanned model (host numpy)."""
  _, template = abstract_model(_with_scan(cfg, False))
  return fill(template, unscan_flat(flatten(params), cfg))


def scan_params(params, cfg: ml_collections.ConfigDict):
  """Params of an unscanned model -> those of the scanned model of the same config (host numpy)."""
  _, template = abstract_model(_with_scan(cfg, True))
  return fill(template, scan_flat(flatten(params), cfg))
