"""The phases of one run as the loop enters them: each phase's trainer, input and evaluators.

A phase's step is compiled once per distinct program (model, masking, batch and sequence shape);
phases that differ only in data, learning rate, RoPE theta or mask rate share it: the learning rate is
one schedule over the whole run (optim.phased_schedule), and RoPE theta and the mask rate are values
passed to the step (config/step_values.py), not constants of it. A different mask rate usually means a
different number of prediction slots (masking.max_predictions), a shape: that compiles. The train state
carries over unchanged.
Inputs are built when a phase begins. A phase whose data section is the one before's (it changes only
the batch size, the learning rate, RoPE theta or the mask rate) continues that phase's order of rows
after the rows read before it; a phase that changes the data (sources, sequence length, mixing) starts a
new order, with the data seed + the phase index, so it does not start again on the first documents of
the corpus. See docs/phases.md.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import ml_collections
from absl import logging

from mlm_jax.config import phases as phases_lib, step_values
from mlm_jax.training import optim, trainer as trainer_lib


@dataclasses.dataclass(frozen=True)
class PhaseParts:
  """What the loop runs a phase with."""
  phase: phases_lib.Phase
  trainer: Any
  input: Any                 # loop.Input
  evaluate: Callable | None
  probe: Callable | None
  tokens_per_example: int
  flops_per_token: float

  @property
  def name(self) -> str:
    return self.phase.name

  @property
  def end(self) -> int:
    return self.phase.end


def program_key(config) -> str:
  """What the jitted step depends on besides the (shared) schedule and the step values."""
  def section(name, skip):
    return {k: v for k, v in config[name].to_dict().items() if f"{name}.{k}" not in skip}
  keep = dict(model=section("model", step_values.FIELDS), masking=section("masking", step_values.FIELDS),
              batch=config.train.batch_size, seq_len=config.data.seq_len, packing=config.data.packing,
              optimizer=section("optimizer", phases_lib.LR_FIELDS))
  return json.dumps(keep, sort_keys=True, default=str)


def input_config(config, index: int) -> ml_collections.FrozenConfigDict:
  """The config a phase's input is built from: the data seed of the order it reads (`index`: the phase
  that began that order)."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.seed = int(config.seed) + index
  return ml_collections.FrozenConfigDict(out)


def _order(config) -> str:
  """What defines the order of training rows: the data section, but for held-out data."""
  return json.dumps({k: v for k, v in config.data.to_dict().items() if k != "eval_sources"}, sort_keys=True,
                    default=str)


def order_of(phases: list, configs: list, k: int) -> tuple[int, int]:
  """(the phase that began the order phase k reads, the global rows of it read before phase k)."""
  first = k
  while first > 0 and _order(configs[first - 1]) == _order(configs[k]):
    first -= 1
  rows = sum((phases[i].end - phases[i].start) * int(configs[i].train.batch_size) for i in range(first, k))
  return first, rows


class PhaseSet:
  """The resolved phases of a run; `enter(k)` builds phase k's parts.

  `make_io(config, input_config, trainer, rows_before) -> (input, evaluate, probe)` is the binary's: the
  held-out evaluator and the probe live above this layer.
  """

  def __init__(self, phases: list, configs: list, mesh, objective_cls, make_io: Callable):
    self.phases, self.configs, self.mesh, self.objective_cls, self.make_io = phases, configs, mesh, objective_cls, make_io
    # The phases that follow the run's schedule are those before any phase sets its own: phase 0's
    # optimizer is then the run's.
    segments = [(p.start, p.end, c.optimizer if _has_own_schedule(phases, p.index) else None)
                for p, c in zip(phases, configs)]
    self.schedule = optim.phased_schedule(configs[0].optimizer, segments, phases[-1].end)
    self._trainers: dict[str, Any] = {}

  def trainer(self, k: int):
    """Phase k's trainer: the compiled steps of the first phase with its program, run with phase k's
    config and step values."""
    config = self.configs[k]
    key = program_key(config)
    if key not in self._trainers:
      self._trainers[key] = trainer_lib.make_trainer(config, self.mesh, self.objective_cls,
                                                     schedule=self.schedule)
    return dataclasses.replace(self._trainers[key], config=config, values=step_values.StepValues.of(config))

  def index_at(self, step: int) -> int:
    return phases_lib.index_at(self.phases, step)

  def enter(self, k: int) -> PhaseParts:
    phase, config = self.phases[k], self.configs[k]
    trainer = self.trainer(k)
    first, rows_before = order_of(self.phases, self.configs, k)
    train_input, evaluate, probe = self.make_io(config, input_config(config, first), trainer, rows_before)
    if first < k:
      logging.info("phase %r continues the data order of phase %r after %d rows", phase.name,
                   self.phases[first].name, rows_before)
    seq_len = config.data.seq_len
    logging.info("phase %d/%d %r: steps %d..%d, global batch %d x %d tokens%s", k + 1, len(self.phases), phase.name,
                 phase.start, phase.end, config.train.batch_size, seq_len,
                 "".join(f", {key}={v}" for key, v in phase.overrides.items()))
    return PhaseParts(phase, trainer, train_input, evaluate, probe, seq_len,
                      self.objective_cls.flops_per_token(config, seq_len, config.masking.max_predictions))


def _has_own_schedule(phases: list, k: int) -> bool:
  """A phase keeps its own learning-rate segment once it or an earlier phase set one."""
  return any(p.own_schedule for p in phases[:k + 1])
