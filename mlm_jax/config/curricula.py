"""Curricula as config fields: values that are a pure function of the training step.

Each is phases `('STEP:VALUE', ...)`, the first at step 0 (masking.mask_rate_schedule, data.mix_alpha_schedule,
data.source_start_steps), so a restored run continues it exactly. The fields: docs/design_notes.md#curricula.
"""
from __future__ import annotations

import numpy as np

from mlm_jax.errors import ConfigError


def parse(spec, key: str) -> tuple[np.ndarray, np.ndarray]:
  """('STEP:VALUE', ...) -> (int64 steps, float64 values); steps increase from 0. Empty -> empty arrays."""
  steps, values = [], []
  for item in spec:
    s, sep, v = str(item).partition(":")
    try:
      if not sep:
        raise ValueError
      steps.append(int(s))
      values.append(float(v))
    except ValueError:
      raise ConfigError(f"{key}: bad phase {item!r}, expected 'STEP:VALUE' (e.g. '1000:0.15')") from None
  if steps and steps[0] != 0:
    raise ConfigError(f"{key}: the first phase must start at step 0, got {spec[0]!r}")
  if any(b <= a for a, b in zip(steps, steps[1:])):
    raise ConfigError(f"{key}: phase steps must increase, got {list(spec)}")
  return np.asarray(steps, np.int64), np.asarray(values, np.float64)


def phase(steps: np.ndarray, step) -> int:
  """Index of the phase that holds `step` (host side)."""
  return int(np.searchsorted(steps, int(step), side="right") - 1)


def value_at(steps, values, step, mode: str = "constant") -> float:
  """The scheduled value at `step` (host side: logging, data pipeline)."""
  i = phase(steps, step)
  if mode == "linear" and i + 1 < len(steps):
    f = (int(step) - steps[i]) / (steps[i + 1] - steps[i])
    return float(values[i] + f * (values[i + 1] - values[i]))
  return float(values[i])


def value_at_traced(steps, values, step, mode: str = "constant"):
  """The same value for a traced step inside jit (float32 scalar)."""
  import jax.numpy as jnp
  s = jnp.asarray(step, jnp.float32)
  st, va = jnp.asarray(steps, jnp.float32), jnp.asarray(values, jnp.float32)
  if mode == "linear":
    return jnp.interp(s, st, va)   # constant after the last point
  i = jnp.clip(jnp.searchsorted(st, s, side="right") - 1, 0, len(steps) - 1)
  return va[i]


# ---- the fields ------------------------------------------------------------------------------
def mask_rate_phases(masking_cfg):
  return parse(masking_cfg.mask_rate_schedule, "masking.mask_rate_schedule")


def max_mask_rate(masking_cfg) -> float:
  """The largest rate the run will use: prediction slots are sized for it, so the step compiles once."""
  _, values = mask_rate_phases(masking_cfg)
  return float(max(values.max(), masking_cfg.mask_rate)) if values.size else float(masking_cfg.mask_rate)


def mask_rate(masking_cfg, step, traced: bool = False, rate=None):
  """The schedule's value at `step`; without a schedule (or at eval, `step` None) `rate`, the step's value
  of masking.mask_rate (config/step_values.py), or masking.mask_rate itself when None."""
  steps, values = mask_rate_phases(masking_cfg)
  if not values.size or step is None:
    return masking_cfg.mask_rate if rate is None else rate
  mode = masking_cfg.mask_rate_schedule_mode
  return (value_at_traced if traced else value_at)(steps, values, step, mode)


def source_starts(data_cfg) -> dict:
  """{source label: first step it is drawn}, from data.source_start_steps ('name=STEP')."""
  out = {}
  for item in data_cfg.get("source_start_steps", ()):
    name, sep, s = str(item).partition("=")
    try:
      if not sep or not name:
        raise ValueError
      out[name] = int(s)
    except ValueError:
      raise ConfigError(f"data.source_start_steps: bad entry {item!r}, expected 'NAME=STEP'") from None
    if out[name] < 0:
      raise ConfigError(f"data.source_start_steps: {item!r} starts before step 0")
  return out


def data_phases(data_cfg) -> tuple[np.ndarray, list]:
  """The steps where the data mixture changes, and (alpha, frozenset of the sources not started yet) per phase.

  Phase boundaries are the union of the alpha schedule's and the source starts' steps.
  """
  a_steps, a_values = parse(data_cfg.get("mix_alpha_schedule", ()), "data.mix_alpha_schedule")
  starts = source_starts(data_cfg)
  bounds = sorted({0, *a_steps.tolist(), *starts.values()})
  phases = []
  for b in bounds:
    alpha = value_at(a_steps, a_values, b) if a_values.size else float(data_cfg.mix_alpha)
    phases.append((alpha, frozenset(n for n, s in starts.items() if s > b)))
  return np.asarray(bounds, np.int64), phases


def has_data_schedule(data_cfg) -> bool:
  return bool(data_cfg.get("mix_alpha_schedule", ()) or data_cfg.get("source_start_steps", ()))
