"""Parameter trees addressed by dotted paths ("layers.3.attention.q_kernel"): the one naming that
checkpoint errors, layout conversion (scan_layout.py) and the Hugging Face converters share.

A leaf: it imports nothing from mlm_jax, so every layer can use it.
"""
from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from mlm_jax.errors import ConversionError


def path_name(path) -> str:
  """A pytree path as a dotted name (params.layers.0.attn.q_kernel), as the errors and converters name
  arrays; nnx's `value` level inside a Variable is left out."""
  keys = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
  return ".".join(str(k) for k in keys if k != "value")


def flatten(params) -> dict[str, np.ndarray]:
  """nnx.State of Params -> {dotted path: numpy array} (gathers sharded arrays to host)."""
  return {path_name(path): np.asarray(jax.device_get(x)) for path, x in jax.tree_util.tree_leaves_with_path(params)}


def fill(template, flat: Mapping[str, np.ndarray]):
  """A copy of `template` (params or their abstract shapes) with values from `flat`, shapes checked."""
  def one(path, x):
    name = path_name(path)
    if name not in flat:
      raise ConversionError(f"no value for parameter {name}")
    v = np.asarray(flat[name])
    if tuple(v.shape) != tuple(x.shape):
      raise ConversionError(f"parameter {name}: shape {tuple(v.shape)} does not match the model's {tuple(x.shape)}")
    return v.astype(x.dtype)
  return jax.tree_util.tree_map_with_path(one, template)
