"""What the loop reports every `train.log_every` steps, and the non-finite policy it applies there.

The step's metric sums stay on device for the interval; `flush` fetches them in one host sync and
writes one line to the console, metrics.jsonl and TensorBoard: the objective's rates, learning rate,
gradient norm, tokens/s (real tokens beside slots), MFU, the input's wait, goodput and ETA. Skipped
non-finite steps are counted there too: train.nonfinite='stop' stops at the first, and a run that only
skips for train.max_consecutive_nonfinite steps has diverged. docs/design_notes.md#loop.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging

from mlm_jax.errors import UserError
from mlm_jax.model import flops
from mlm_jax.workdir import goodput
from mlm_jax.workdir.metrics_log import MetricsWriter


class LogInterval:
  """Metric sums of one log interval, kept on device until the interval is logged."""

  def __init__(self, loop: Any, recorder: goodput.Recorder):
    """`loop`: the training/loop.Loop it reports on (its current phase's trainer, input, rates and ETA)."""
    self.loop, self.goodput = loop, recorder
    self.peak = flops.peak_flops(loop.trainer.config)   # measured once per run on CPU
    self.bad_in_a_row = 0
    self.restart()

  def restart(self) -> None:
    self.sums, self.since, self.input_seconds, self.t0 = None, 0, 0.0, time.perf_counter()

  def add(self, metrics) -> None:
    self.sums = metrics if self.sums is None else jax.tree.map(jnp.add, self.sums, metrics)
    self.since += 1

  def flush(self, step: int, writer: MetricsWriter) -> dict:
    loop, t = self.loop, self.loop.train_config
    host, since = jax.device_get(self.sums), self.since
    now = time.perf_counter()
    seconds = max(now - self.t0, 1e-9)
    examples_per_sec = since * t.batch_size / seconds
    tokens_per_sec = examples_per_sec * loop.tokens_per_example
    slots = since * t.batch_size * loop.tokens_per_example
    real = float(host["real_tokens"]) if "real_tokens" in host else slots
    real_tokens_per_sec = real / seconds
    objective = loop.trainer.objective
    line = dict(step=step, **objective.summarize(host), **getattr(loop.input, "metrics", dict)(),
                **getattr(objective, "schedule_values", lambda s: {})(step - 1),   # the last step's
                learning_rate=float(host["learning_rate"]) / since, grad_norm=float(host["grad_norm"]) / since,
                tokens_per_sec=tokens_per_sec, examples_per_sec=examples_per_sec,
                real_tokens_per_sec=real_tokens_per_sec, real_fraction=real / max(slots, 1),
                mfu=flops.mfu(real_tokens_per_sec, loop.flops_per_token, self.peak),
                input_wait_fraction=min(self.input_seconds / seconds, 1.0), goodput=self.goodput.fraction(),
                skipped_nonfinite=int(round(since - float(host["finite"]))))
    if loop.phase_name:
      line["phase"] = loop.phase_name
    end = loop.end_step
    eta = loop.eta_seconds(step)
    writer.write(line)
    logging.info("step %d/%d%s  %s  lr %.2e  %.0f tok/s (real %.0f%%)  MFU %.1f%%  input %.0f%%  ETA %s", step,
                 end, f" [{loop.phase_name}]" if loop.phase_name else "", loop.trainer.objective.console(line), line["learning_rate"], real_tokens_per_sec,
                 100 * line["real_fraction"], 100 * line["mfu"],
                 100 * line["input_wait_fraction"], "-" if eta is None else _clock(eta))
    self._check_finite(line, step)
    self.restart()
    return line

  def _check_finite(self, line: dict, step: int) -> None:
    t, skipped = self.loop.train_config, line["skipped_nonfinite"]
    if skipped and t.nonfinite == "stop":
      raise UserError(f"non-finite loss or gradient at step <= {step} (train.nonfinite='stop'); the last "
                      "checkpoint is intact. Lower optimizer.learning_rate or set train.nonfinite='skip'")
    # Skipped steps in a row (as far as log intervals tell): a run that only skips has diverged.
    self.bad_in_a_row = self.bad_in_a_row + self.since if skipped == self.since else skipped
    if self.bad_in_a_row >= t.max_consecutive_nonfinite:
      raise UserError(f"{self.bad_in_a_row} consecutive non-finite steps up to step {step}: training diverged; "
                      "the last checkpoint is intact. Lower optimizer.learning_rate")


def _clock(seconds: float) -> str:
  """H:MM:SS, the hours past a day included."""
  s = int(round(seconds))
  return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"
