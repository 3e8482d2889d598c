"""Goodput: where a run's wall time went, over all its restarts, in WORKDIR/goodput.json.

Each process that runs the loop is one segment. Its wall time, from the process's start (the OS's
record of it, so start-up before Python counts too) to its last record, is split into:
  startup   everything before the first step that is not a restore (flags, tokenizer, input, init)
  restore   reading the checkpoint
  compile   the first train step of the process (tracing and compiling it)
  input     waiting for batches
  eval      held-out evaluation (its compile included), probes: `probe`
  save      the blocking part of checkpoint saves, and waiting for the last one at the end
  step      the rest of the loop: the productive steps (and the host work between them)
so the parts add up to the wall time by construction; the test checks that sum against a clock
outside the process. `lost` moves seconds out of earlier segments' `step`: on resume, the steps a
killed run made after the checkpoint it resumes from (the newest step in metrics.jsonl and in the
killed segment's record) are recomputed, and their seconds come from the killed segment's marks
(step seconds at each save and log line). Time between a killed segment's last record and the next
segment's start (the kill, a machine being replaced) is `between runs`.

The file is rewritten (atomically where local) at every log line and save, by process 0 only, so a
run killed with -9 has a record up to its last log line. The cost per step is one addition; a
record is a few hundred bytes of JSON per segment.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from mlm_jax import paths

FILE = "goodput.json"
CATEGORIES = ("startup", "restore", "compile", "step", "input", "eval", "probe", "save")
MAX_MARKS = 64


def process_start_time() -> float:
  """Unix time at which this process started (Linux: /proc, to 10 ms), else when this module was imported."""
  try:
    with open("/proc/self/stat") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22: start, in clock ticks since boot
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start
  except (OSError, ValueError, IndexError, AttributeError):
    return _IMPORTED


_IMPORTED = time.time()


def read(workdir: str) -> list[dict]:
  """The segments recorded in WORKDIR/goodput.json (none when it is missing or unreadable)."""
  path = os.path.join(workdir, FILE)
  if not paths.exists(path):
    return []
  try:
    with paths.open_file(path, "r") as f:
      return list(json.load(f).get("segments", []))
  except (ValueError, OSError):
    return []


def _write(workdir: str, segments: list[dict]) -> None:
  path = os.path.join(workdir, FILE)
  text = json.dumps(dict(version=1, segments=segments), indent=1)
  if paths.is_remote(path):
    with paths.open_file(path, "w") as f:
      f.write(text)
    return
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _step_seconds_at(segment: dict, step: int) -> float:
  """A segment's cumulative step seconds when it had completed `step` (its marks, linear in between)."""
  marks = [(segment["start_step"], 0.0)] + [tuple(m) for m in segment.get("marks", [])]
  marks.append((segment["end_step"], segment["seconds"]["step"]))
  before = max((m for m in marks if m[0] <= step), default=marks[0])
  after = min((m for m in marks if m[0] >= step), default=marks[-1])
  if after[0] == before[0]:
    return before[1]
  return before[1] + (after[1] - before[1]) * (step - before[0]) / (after[0] - before[0])


def lost_work(segments: list[dict], resumed_step: int, reached_step: int) -> dict:
  """The steps after `resumed_step` that earlier segments computed (up to `reached_step`), and their seconds."""
  reached = max([reached_step, resumed_step] + [s["end_step"] for s in segments])
  seconds = 0.0
  for seg in reversed(segments):
    if seg["end_step"] <= resumed_step:
      break
    seconds += seg["seconds"]["step"] - _step_seconds_at(seg, max(resumed_step, seg["start_step"]))
    if seg["start_step"] <= resumed_step:
      break
  return dict(steps=reached - resumed_step, seconds=max(seconds, 0.0), from_step=resumed_step, to_step=reached)


def totals(segments: list[dict]) -> dict:
  """Seconds by category over all segments, with `lost` taken out of `step`, `between_runs`, the
  span from the first start to the last record, and `goodput` = productive step seconds / span."""
  out = dict.fromkeys(CATEGORIES, 0.0)
  lost_s, lost_steps = 0.0, 0
  for seg in segments:
    for k in CATEGORIES:
      out[k] += seg["seconds"].get(k, 0.0)
    lost_s += seg.get("lost", {}).get("seconds", 0.0)
    lost_steps += seg.get("lost", {}).get("steps", 0)
  out["step"] -= lost_s
  out["lost"] = lost_s
  span = (segments[-1]["end_time"] - segments[0]["start_time"]) if segments else 0.0
  out["between_runs"] = max(span - sum(s["wall_seconds"] for s in segments), 0.0)
  return dict(seconds=out, span_seconds=span, lost_steps=lost_steps, runs=len(segments),
              goodput=out["step"] / span if span > 0 else 0.0)


def summary_line(t: dict) -> str:
  s = t["seconds"]
  parts = [f"{name} {s[k]:.1f} s" for k, name in (
      ("step", "steps"), ("compile", "compile"), ("input", "input"), ("eval", "eval"), ("probe", "probes"),
      ("save", "saves"), ("restore", "restores"), ("startup", "start-up"))]
  parts.append(f"lost {s['lost']:.1f} s ({t['lost_steps']} steps recomputed)")
  if s["between_runs"] > 0.05:
    parts.append(f"between runs {s['between_runs']:.1f} s")
  runs = f" in {t['runs']} runs" if t["runs"] > 1 else ""
  return f"goodput {100 * t['goodput']:.1f}% of {t['span_seconds']:.1f} s{runs}: " + ", ".join(parts)


class Recorder:
  """This process's segment: the loop adds seconds to `seconds[...]` (or times a block with `phase`),
  calls `begin_steps` before the first step, `mark` at saves and log lines, `close` at the end."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.workdir, self.enabled = workdir, enabled
    self.seconds = dict.fromkeys(CATEGORIES, 0.0)
    self.t_start = process_start_time()
    self._earlier = read(workdir) if enabled else []
    self._t_earlier = totals(self._earlier) if self._earlier else None
    self._begun, self._marks, self._lost = False, [], dict(steps=0, seconds=0.0)
    self.start_step = self.step = 0

  @contextlib.contextmanager
  def phase(self, name: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] += time.perf_counter() - t0

  def _residual(self) -> float:
    return time.time() - self.t_start - sum(v for k, v in self.seconds.items() if k != self._open)

  @property
  def _open(self) -> str:
    return "step" if self._begun else "startup"

  def begin_steps(self, start_step: int, reached_step: int = 0) -> None:
    """Start-up ends; `reached_step`: the newest step a killed predecessor logged (metrics.jsonl)."""
    self.seconds["startup"] = self._residual()
    self._begun, self.start_step, self.step = True, start_step, start_step
    if self._earlier or reached_step > start_step:
      self._lost = lost_work(self._earlier, start_step, reached_step)
    self.mark(start_step)

  def mark(self, step: int, status: str = "running") -> None:
    """Record the segment as of `step` (completed) and rewrite goodput.json."""
    if not self.enabled:
      return
    if self._begun:
      self.seconds["step"] = self._residual()
      if step > self.start_step:
        self._marks = (self._marks + [[step, self.seconds["step"]]])[-MAX_MARKS:]
    else:
      self.seconds["startup"] = self._residual()
    self.step = step
    _write(self.workdir, self._earlier + [self.segment(status)])

  def segment(self, status: str = "running") -> dict:
    now = time.time()
    return dict(host=socket.gethostname(), pid=os.getpid(), status=status, start_time=self.t_start, end_time=now,
                wall_seconds=now - self.t_start, start_step=self.start_step, end_step=self.step,
                seconds=dict(self.seconds), lost=self._lost, marks=self._marks)

  def wall_seconds(self) -> float:
    """The run's wall time so far: the earlier segments' and this process's since its start, without the
    time between runs (what train.time_budget_minutes counts; process 0's alone holds the earlier ones)."""
    return sum(s["wall_seconds"] for s in self._earlier) + time.time() - self.t_start

  def fraction(self) -> float:
    """Goodput so far over the whole run (earlier segments, lost work out, time between runs in)."""
    step = self._residual() if self._begun else 0.0
    earlier = self._t_earlier
    productive = step - self._lost["seconds"] + (earlier["seconds"]["step"] if earlier else 0.0)
    span = time.time() - (self._earlier[0]["start_time"] if self._earlier else self.t_start)
    return productive / span if span > 0 else 0.0

  def close(self, step: int, status: str) -> str:
    """The final record; returns the one-line summary over all segments ('' on other processes)."""
    if not self.enabled:
      return ""
    self.mark(step, status)
    return summary_line(totals(self._earlier + [self.segment(status)]))
