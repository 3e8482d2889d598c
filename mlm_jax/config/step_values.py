"""Values of the jitted step that a run in phases may change without compiling the step again.

RoPE theta (global and local) and the mask rate are numbers inside the step, not shapes: the trainer
passes them to its jitted steps as an argument (float32 scalars) and binds them here while the step is
traced; the encoder and the masking read them from here instead of taking their config's value as a
constant. Outside a trainer's step (conversion, fill-mask, the evaluation tools) nothing is bound and
the config's values are used. So phases that differ only in these share one compiled step
(training/phase_runner.py), and the numbers are those of the constants (docs/phases.md).
"""
from __future__ import annotations

import contextlib
import contextvars

# "section.field" of each value; a config without the section (fine-tuning has no masking) has none.
FIELDS = ("model.rope_theta", "model.rope_theta_local", "masking.mask_rate")

_BOUND: contextvars.ContextVar = contextvars.ContextVar("mlm_jax_step_values", default=None)


def of(config) -> dict:
  """{field: float32 scalar} of `config`'s step values (numpy; the trainer places them on its mesh)."""
  import numpy as np
  out = {}
  for key in FIELDS:
    section, field = key.split(".")
    if section in config and field in config[section]:
      out[key] = np.float32(config[section][field])
  return out


@contextlib.contextmanager
def bound(values: dict):
  """Inside: `get` returns `values` (the traced arguments of the step being traced)."""
  token = _BOUND.set(values)
  try:
    yield
  finally:
    _BOUND.reset(token)


def get(key: str, default):
  """The bound value of `key`, else `default` (the config's constant)."""
  values = _BOUND.get()
  return default if values is None or key not in values else values[key]
