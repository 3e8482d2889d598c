"""Values of the jitted step that a run in phases may change without compiling the step again.

RoPE theta (global and local) and the mask rate are numbers inside the step, not shapes: the trainer
passes a `StepValues` of float32 scalars to its jitted steps as an argument, and the step hands it on to
the objective's calls, which hand it to the encoder (`step_values=`) and to the masking (`rate=`). Outside
a trainer's step (conversion, fill-mask, the evaluation tools, fine-tuning's predictions) nobody passes
one and the config's values are used as constants. So phases that differ only in these share one
compiled step (training/phase_runner.py), and the numbers are those of the constants (docs/phases.md).
"""
from __future__ import annotations

from typing import Any, NamedTuple

# "section.field" of each value; a config without the section (fine-tuning has no masking) has none.
FIELDS = ("model.rope_theta", "model.rope_theta_local", "masking.mask_rate")


class StepValues(NamedTuple):
  """The step's values (a pytree of float32 scalars; a field is None where the config has none, and then
  the config's constant is used)."""
  rope_theta: Any = None
  rope_theta_local: Any = None
  mask_rate: Any = None

  @classmethod
  def of(cls, config) -> "StepValues":
    """`config`'s values as numpy float32 scalars (the trainer's jit places them on its mesh)."""
    import numpy as np
    out = {}
    for key in FIELDS:
      section, field = key.split(".")
      if section in config and field in config[section]:
        out[field] = np.float32(config[section][field])
    return cls(**out)


def mask_rate(values: StepValues | None, masking_cfg):
  """The step's mask rate, else masking.mask_rate (a constant)."""
  return masking_cfg.mask_rate if values is None or values.mask_rate is None else values.mask_rate


def rope_thetas(values: StepValues | None, model_cfg) -> dict | None:
  """{"global", "local"} RoPE thetas of the step for a rotary model, or None: each layer's constant."""
  if values is None or values.rope_theta is None or model_cfg.positions != "rotary":
    return None
  local = model_cfg.rope_theta_local if values.rope_theta_local is None else values.rope_theta_local
  return {"global": values.rope_theta, "local": local}
