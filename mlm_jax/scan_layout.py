"""Scanned <-> unscanned parameter layouts, so checkpoints move between `model.scan_layers` settings.

Unscanned (model.scan_layers=False), one entry per layer:
  layers.{i}.attention.q_kernel                      [H, N, D]
Scanned, g = attention.group_size(cfg) layers per group, n = num_layers // g groups:
  layer_groups.layers.{j}.attention.q_kernel         [n, H, N, D]   layer i = k * g + j at [k]
  tail_layers.{t}.attention.q_kernel                 [H, N, D]      layer i = n * g + t
Everything else (embeddings, head) is the same in both. Names are the dotted paths of
mlm_jax/convert/hf.py (`flatten`), which both directions work on.
"""
from __future__ import annotations

import re

import numpy as np
import ml_collections

from mlm_jax import attention


def _counts(cfg: ml_collections.ConfigDict) -> tuple[int, int]:
  g = attention.group_size(cfg)
  return cfg.num_layers // g, g


def unscan_flat(flat: dict, cfg: ml_collections.ConfigDict) -> dict:
  """{scanned dotted name: array} -> {unscanned dotted name: array}."""
  n, g = _counts(cfg)
  out = {}
  for name, x in flat.items():
    grouped = re.fullmatch(r"layer_groups\.layers\.(\d+)\.(.+)", name)
    tail = re.fullmatch(r"tail_layers\.(\d+)\.(.+)", name)
    if grouped:
      j, rest = int(grouped[1]), grouped[2]
      out.update({f"layers.{k * g + j}.{rest}": x[k] for k in range(n)})
    elif tail:
      out[f"layers.{n * g + int(tail[1])}.{tail[2]}"] = x
    else:
      out[name] = x
  return out


def scan_flat(flat: dict, cfg: ml_collections.ConfigDict) -> dict:
  """{unscanned dotted name: array} -> {scanned dotted name: array} (stacked as numpy)."""
  n, g = _counts(cfg)
  out, stacks = {}, {}
  for name, x in flat.items():
    layer = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if not layer:
      out[name] = x
      continue
    i, rest = int(layer[1]), layer[2]
    if i < n * g:
      stacks.setdefault(f"layer_groups.layers.{i % g}.{rest}", [None] * n)[i // g] = x
    else:
      out[f"tail_layers.{i - n * g}.{rest}"] = x
  out.update({name: np.stack([np.asarray(x) for x in xs]) for name, xs in stacks.items()})
  return out


def _with_scan(cfg: ml_collections.ConfigDict, scan: bool) -> ml_collections.ConfigDict:
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.scan_layers = scan
  return out


def unscan_params(params, cfg: ml_collections.ConfigDict):
  """Params of a scanned model (`cfg.scan_layers` True) -> those of the unscanned model (host numpy)."""
  from mlm_jax import step
  from mlm_jax.convert import hf
  _, template = step.abstract_model(_with_scan(cfg, False))
  return hf.fill(template, unscan_flat(hf.flatten(params), cfg))


def scan_params(params, cfg: ml_collections.ConfigDict):
  """Params of an unscanned model -> those of the scanned model of the same config (host numpy)."""
  from mlm_jax import step
  from mlm_jax.convert import hf
  _, template = step.abstract_model(_with_scan(cfg, True))
  return hf.fill(template, scan_flat(hf.flatten(params), cfg))
