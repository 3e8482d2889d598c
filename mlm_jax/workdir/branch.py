"""`branch_from=WORKDIR:STEP`: a new run that starts from step STEP of another with its whole state
(parameters, optimizer, data position, phase), then trains under its own config (a decay, a lower
learning rate). Unlike `init_from` (the weights alone). The source is only read. docs/phases.md#branching.
"""
from __future__ import annotations

import os

from mlm_jax import paths
from mlm_jax.errors import CheckpointError, ConfigError


def parse(spec: str) -> tuple[str, int]:
  """'WORKDIR:STEP' -> (absolute WORKDIR, STEP)."""
  workdir, sep, step = str(spec).rpartition(":")
  if not sep or not workdir or not step.isdigit():
    raise ConfigError(f"branch_from={spec!r}: expected WORKDIR:STEP (a training workdir and one of its checkpoint steps)")
  return paths.absolute(workdir), int(step)


def check(spec: str, workdir: str) -> tuple[str, int]:
  """The source and step, checked before anything is written: the step has a checkpoint, and the
  source is not this run's own workdir."""
  from mlm_jax.workdir import checkpoints
  source, step = parse(spec)
  if os.path.normpath(source) == os.path.normpath(paths.absolute(workdir)):
    raise ConfigError(f"branch_from={spec!r}: the source is this run's own workdir; branch into a new one")
  steps = checkpoints.steps_of(source)
  if not steps:
    raise CheckpointError(f"branch_from={spec!r}: {source} has no checkpoints")
  if step not in steps:
    raise CheckpointError(f"branch_from={spec!r}: no checkpoint for step {step} in {source} (have "
                          f"{', '.join(map(str, steps))})")
  return source, step
