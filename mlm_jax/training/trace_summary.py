"""What a captured profile says: the top operations by self time and each profiled step's breakdown.

Reads the XSpace a jax.profiler trace wrote (`<host>.xplane.pb`, with jax's own reader
`jax.profiler.ProfileData`, no TensorBoard needed). Where the work ran:
- accelerators: the first device plane (`/device:TPU:0`, `/device:GPU:0`), whose `XLA Ops` line
  holds one event per executed HLO op and `XLA Modules` one per program execution;
- CPU: the `/host:CPU` plane, where XLA's thunks run on host threads as events carrying `hlo_op`,
  `hlo_module` and `run_id` stats (an execution = the ops of one run_id).
Self time of an op is its duration less that of the ops nested in it on the same line; on CPU,
ops of one step run on several threads at once, so op time adds up to more than the step.

Steps are the loop's `StepTraceAnnotation("train", step_num=N)` (profiling.py). For each: the
host's time in it and in its `input` annotation, the train step program's execution that started
in it (device span and busy time: the union of its ops), and the period to the next step's start,
of which the device was idle the rest (host-bound or waiting for input).
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import os

from mlm_jax.errors import UserError

TRAIN_PROGRAM = "jit_train_step"


@dataclasses.dataclass
class Event:
  name: str
  start: float   # ns
  end: float
  stats: dict


def find_traces(path: str) -> list[str]:
  """`.xplane.pb` files of the newest capture under a workdir (WORKDIR/tensorboard/plugins/profile/*/),
  a capture folder, or the file itself."""
  if os.path.isfile(path):
    return [path]
  for root in (os.path.join(path, "tensorboard", "plugins", "profile"), os.path.join(path, "plugins", "profile"),
               path):
    runs = sorted(d for d in glob.glob(os.path.join(root, "*")) if glob.glob(os.path.join(d, "*.xplane.pb")))
    if runs:
      return sorted(glob.glob(os.path.join(runs[-1], "*.xplane.pb")))
    here = sorted(glob.glob(os.path.join(root, "*.xplane.pb")))
    if here:
      return here
  raise UserError(f"{path}: no profile (*.xplane.pb) found; capture one with --config.train.profile_steps=(FIRST,COUNT)")


def _events(line) -> list[Event]:
  return [Event(e.name, e.start_ns, e.start_ns + e.duration_ns, dict(e.stats)) for e in line.events]


def _load(path: str):
  import jax
  try:
    return jax.profiler.ProfileData.from_file(path)
  except Exception as e:  # noqa: BLE001 - a truncated or foreign file
    raise UserError(f"{path}: not a readable profile ({type(e).__name__}: {e})") from None


def _self_times(ops: list[Event]) -> list[tuple[Event, float]]:
  """(op, self time) for the ops of one line: duration less the ops nested directly inside it."""
  out, stack = [], []
  for e in sorted(ops, key=lambda e: (e.start, -e.end)):
    while stack and stack[-1][0].end <= e.start:
      out.append(tuple(stack.pop()))
    if stack:
      stack[-1][1] -= min(e.end, stack[-1][0].end) - e.start
    stack.append([e, e.end - e.start])
  out.extend(tuple(s) for s in reversed(stack))
  return out


def _union(intervals) -> float:
  total, end = 0.0, None
  for s, e in sorted(intervals):
    if end is None or s > end:
      total, end = total + (e - s), e
    elif e > end:
      total, end = total + (e - end), e
  return total


def summarize(path: str, top: int = 15) -> dict:
  """{path, device, ops: [{name, count, self_ms, share}], op_ms, steps: [{step, host_ms, input_ms,
  device_ms, busy_ms, period_ms, idle_ms}], mean: {...}} from one .xplane.pb."""
  data = _load(path)
  planes = list(data.planes)
  device = next((p for p in planes if p.name.startswith("/device:") and "CUSTOM" not in p.name
                 and any(line.name == "XLA Ops" for line in p.lines)), None)
  host = next((p for p in planes if p.name == "/host:CPU"), None)
  op_lines, executions = [], collections.defaultdict(list)
  if device is not None:
    for line in device.lines:
      if line.name == "XLA Ops":
        op_lines.append(_events(line))
      elif line.name == "XLA Modules":
        for e in _events(line):
          executions[(e.name, e.start)].append((e.start, e.end))
  elif host is not None:
    for line in host.lines:
      ops = [e for e in _events(line) if "hlo_op" in e.stats and not e.name.startswith("end: ")]
      if ops:
        op_lines.append(ops)
        for e in ops:
          executions[(e.stats.get("hlo_module", ""), e.stats.get("run_id", 0))].append((e.start, e.end))
  annotations = []
  if host is not None:
    for line in host.lines:
      annotations += [e for e in _events(line) if e.name in ("train", "input")]
  if not op_lines:
    raise UserError(f"{path}: no XLA operations in the trace (was a step running while it was captured?)")

  by_op = collections.defaultdict(lambda: [0, 0.0])
  for ops in op_lines:
    for e, self_ns in _self_times(ops):
      k = by_op[e.stats.get("hlo_op", e.name)]
      k[0] += 1
      k[1] += self_ns
  op_ns = sum(v[1] for v in by_op.values())
  ranked = sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]
  ops_out = [dict(name=n, count=c, self_ms=s / 1e6, share=s / op_ns if op_ns else 0.0) for n, (c, s) in ranked]

  train_runs = sorted((min(s for s, _ in iv), max(e for _, e in iv), _union(iv))
                      for (module, _), iv in executions.items() if module.startswith(TRAIN_PROGRAM))
  steps_ann = sorted((e for e in annotations if e.name == "train" and "step_num" in e.stats), key=lambda e: e.start)
  inputs = [e for e in annotations if e.name == "input"]
  steps = []
  for i, st in enumerate(steps_ann):
    nxt = steps_ann[i + 1].start if i + 1 < len(steps_ann) else float("inf")
    runs = [r for r in train_runs if st.start <= r[0] < nxt]
    inp = sum(e.end - e.start for e in inputs if st.start <= e.start < st.end)
    device_ns = sum(r[1] - r[0] for r in runs)
    busy_ns = sum(r[2] for r in runs)
    end = nxt if nxt != float("inf") else max([st.end] + [r[1] for r in runs])
    period = end - st.start
    steps.append(dict(step=int(st.stats["step_num"]), host_ms=(st.end - st.start) / 1e6, input_ms=inp / 1e6,
                      device_ms=device_ns / 1e6, busy_ms=busy_ns / 1e6, period_ms=period / 1e6,
                      idle_ms=max(period - busy_ns, 0.0) / 1e6, executions=len(runs)))
  mean = {k: sum(s[k] for s in steps) / len(steps) for k in ("host_ms", "input_ms", "device_ms", "busy_ms",
                                                             "period_ms", "idle_ms")} if steps else {}
  return dict(path=path, device=device.name if device is not None else "/host:CPU", ops=ops_out, op_ms=op_ns / 1e6,
              distinct_ops=len(by_op), steps=steps, mean=mean)


def format_text(s: dict) -> str:
  lines = [f"{s['path']}: ops on {s['device']}, {s['distinct_ops']} distinct, {s['op_ms']:.1f} ms of op self time"]
  lines.append("top operations by self time:")
  lines.append(f"  {'op':48s} {'count':>6s} {'self ms':>9s} {'share':>6s}")
  for o in s["ops"]:
    lines.append(f"  {o['name'][:48]:48s} {o['count']:6d} {o['self_ms']:9.2f} {100 * o['share']:5.1f}%")
  if not s["steps"]:
    lines.append("no annotated steps (a trace not captured by train.profile_steps)")
    return "\n".join(lines)
  lines.append("step breakdown (ms): host = in the loop's step annotation, of it input = fetching the batch; "
               "device = the train step's execution, busy = its ops' union; period = to the next step's start; "
               "idle = period - busy")
  lines.append(f"  {'step':>6s} {'period':>8s} {'host':>8s} {'input':>8s} {'device':>8s} {'busy':>8s} {'idle':>8s}")
  for st in s["steps"] + [dict(step="mean", **s["mean"])]:
    lines.append(f"  {st['step']!s:>6s} {st['period_ms']:8.2f} {st['host_ms']:8.2f} {st['input_ms']:8.2f} "
                 f"{st['device_ms']:8.2f} {st['busy_ms']:8.2f} {st['idle_ms']:8.2f}")
  return "\n".join(lines)
