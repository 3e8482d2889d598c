"""Profiles of a few steps of a real run: `train.profile_steps=(first, count)` (pretraining and fine-tuning).

The loop calls `begin(step)` before fetching a step's batch, `input_done()` after it and `end(step,
state)` after the step; outside the window each is one comparison. In the window, a jax.profiler
trace runs (device and host activity, XLA ops), each step is a `StepTraceAnnotation("train",
step_num=N)` with an `input` annotation for its batch, and the last step's state is waited for
before the trace stops, so its device work is in the trace. The trace goes to
WORKDIR/tensorboard/plugins/profile/<time>/<host>.xplane.pb, where TensorBoard's profile plugin
(and tools/profile_summary.py) read it.

Steps are numbered as the log numbers them (the first step of a run is 1). A process's first
step compiles the train step, so a window that includes it (or `first=0`) starts at the step after
it, with the same count. On several
hosts, process 0 traces unless `train.profile_all_hosts`.
"""
from __future__ import annotations

import os

import jax
import ml_collections
from absl import logging

from mlm_jax.errors import ConfigError


def window(t: ml_collections.ConfigDict, start: int) -> tuple[int, int] | None:
  """(first, last) step numbers to trace in a process that resumes after step `start`, or None."""
  spec = tuple(t.get("profile_steps", ()) or ())
  if not spec:
    return None
  if len(spec) != 2 or not all(isinstance(x, int) for x in spec) or spec[0] < 0 or spec[1] < 1:
    raise ConfigError(f"train.profile_steps={spec!r}: expected (first step, number of steps), e.g. (100, 5)")
  first, count = spec
  if first == 0 or first <= start + 1 <= first + count - 1:
    logging.info("train.profile_steps=%s: step %d compiles the train step; profiling steps %d..%d", spec,
                 start + 1, start + 2, start + count + 1)
    first = start + 2
  elif first + count - 1 <= start:   # a resumed run past the window
    return None
  return first, first + count - 1


class StepProfiler:
  """A jax.profiler trace of the steps in `window(t, start)`, into WORKDIR/tensorboard."""

  def __init__(self, t: ml_collections.ConfigDict, workdir: str, start: int):
    span = window(t, start)
    here = jax.process_index() == 0 or bool(t.get("profile_all_hosts", False))
    self.first, self.last = span if span and here else (-1, -1)
    self.log_dir = os.path.join(workdir, "tensorboard")
    self.tracing, self._open = False, []

  def begin(self, step: int) -> None:
    """Before step `step + 1` (the loop's count of completed steps): start the trace, annotate the step."""
    n = step + 1
    if n < self.first or n > self.last:
      return
    if n == self.first:
      jax.profiler.start_trace(self.log_dir)
      self.tracing = True
      logging.info("profiling steps %d..%d into %s/plugins/profile", self.first, self.last, self.log_dir)
    self._enter(jax.profiler.StepTraceAnnotation("train", step_num=n))
    self._enter(jax.profiler.TraceAnnotation("input"))

  def _enter(self, annotation) -> None:
    annotation.__enter__()
    self._open.append(annotation)

  def input_done(self) -> None:
    if self._open:
      self._open.pop().__exit__(None, None, None)

  def end(self, step: int, state) -> None:
    """After step `step` (completed count) ran: close its annotation; after the last, stop the trace."""
    if not self._open:
      return
    while self._open:
      self._open.pop().__exit__(None, None, None)
    if step == self.last:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    """Stop a trace still running (the run ended or failed inside the window)."""
    while self._open:
      self._open.pop().__exit__(None, None, None)
    if self.tracing:
      self.tracing = False
      jax.profiler.stop_trace()
      logging.info("profile of steps %d..%d written to %s/plugins/profile (tools/profile_summary.py --workdir=...)",
                   self.first, self.last, self.log_dir)
