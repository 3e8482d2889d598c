"""A wall-time budget (`train.time_budget_minutes`): the run's steps fixed from its measured speed, and
planned again when the machine's speed drifts.

A budget in minutes is what a "one hour on this machine" recipe means, and a fixed step count sized on
one machine overruns on a slower one. Cramming (Geiping & Goldstein, 2023) makes the schedule a function
of elapsed time; that would make the learning rate depend on the clock, so a resumed run could not repeat
an uninterrupted one. Here the clock is read at recorded steps instead: after `train.budget_calibration_steps`
steps past the compile, and one timed evaluation and probe, the loop picks the most steps whose time, with the
evaluations, probes and saves on their cadences, fits what is left of the budget, and writes that count to
WORKDIR/time_budget.json. The decision falls inside the warmup, whose learning rate does not depend on the
length, so the steps before it are those of the plain run too.

A shared VM's speed drifts by 15-20% within an hour (docs/resume.md#a-time-budget), and a run that keeps its
first count then misses its budget by as much. With `train.budget_replan` (the default) the loop looks again
at each log line after the warmup: once it has timed at least WINDOW of the budget's steps since the last plan,
and the end it now predicts misses the budget by more than TOLERANCE, it plans the steps again from that speed.
The schedule is not cut or restarted but stretched: the part of it not yet trained (its progress from the plan's step
to the end) is spread over the new number of steps (`stretch`), so the learning rate stays continuous and
still decays to its end at the last step. Each new plan is appended to the record's "replans" before any
step trains under it; a resume replays the record, so it trains exactly the steps an uninterrupted run with
the same plans trains. Without replans the run is a plain run of "steps" (a rerun with `train.steps` set to
it trains the same steps).

The time counted is goodput's (workdir/goodput.py): every run of the workdir from its process's start
(tokenizer training and start-up included) to now, without the time between runs.
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp

from mlm_jax import paths
from mlm_jax.errors import UserError

FILE = "time_budget.json"
MARGIN = 0.01   # of the budget, kept for what no cadence covers (the final wait for the last save)
TOLERANCE = 0.03   # of the budget: how far the predicted end may drift before the steps are planned again
WINDOW = 0.1       # of the budget: the least time of steps since the last plan that a new plan's speed is read from


def minutes(train) -> float:
  """The budget a `train` section asks for, in minutes; 0: none (train.steps as given)."""
  return float(train.get("time_budget_minutes", 0.0) or 0.0)


def read(workdir: str) -> dict | None:
  """The decision recorded in WORKDIR/time_budget.json, or None when there is none yet."""
  path = os.path.join(workdir, FILE)
  if not paths.exists(path):
    return None
  try:
    with paths.open_file(path, "r") as f:
      record = json.load(f)
    int(record["steps"])
    plans = replans(record)
    if any(end <= at for at, end in plans) or [at for at, _ in plans] != sorted({at for at, _ in plans}):
      raise ValueError(f"replans {plans} are not (at_step, steps) with steps > at_step, in step order")
  except (ValueError, KeyError, TypeError, OSError) as e:
    raise UserError(f"{path}: unreadable ({e}); expected the step count a time budget fixed, "
                    '{"steps": N, ...}. Restore it, or delete it to decide again') from None
  return record


def replans(record: dict) -> list[tuple[int, int]]:
  """A record's later plans, (the step that planned, the run's steps from then on), in step order."""
  return [(int(r["at_step"]), int(r["steps"])) for r in record.get("replans", [])]


def first_steps(record: dict) -> int:
  """The steps the first decision fixed: what the schedule before any replan decays over."""
  return int(record.get("decided_steps", record["steps"]))


def stretch(schedule, total: int, plans: list[tuple[int, int]]):
  """`schedule` (made for `total` steps) with each plan (at, end) spreading what was left of it after step
  `at` evenly over the steps at..end: step s reads the schedule at the step of its progress there."""
  if not plans:
    return schedule
  points, at, virtual, rate = [], 0, 0.0, 1.0
  for r, end in plans:
    virtual += (r - at) * rate   # where step r stands in the schedule under the plan before
    at, rate = r, (total - virtual) / (end - r)
    points.append((at, virtual, rate))

  def stretched(count):
    s = jnp.asarray(count, jnp.float32)
    v = s
    for at, start, slope in points:
      v = jnp.where(s >= at, start + (s - at) * slope, v)
    return schedule(jnp.minimum(v, float(total)))
  return stretched


def write(workdir: str, record: dict) -> None:
  with paths.open_file(os.path.join(workdir, FILE), "w") as f:
    f.write(json.dumps(record, indent=1, sort_keys=True))


def events(after: int, end: int, every: int) -> int:
  """How many times a cadence of `every` steps fires in steps (after, end], the end always included."""
  if end <= after:
    return 0
  on_cadence = end // every - after // every if every > 0 else 0
  return on_cadence + (0 if every > 0 and end % every == 0 else 1)


def seconds_to(end: int, at: int, costs: dict) -> float:
  """Seconds from step `at` to the end of a run of `end` steps: `costs` holds "step" (seconds a step)
  and, per cadence, (every, seconds each) under "eval", "probe" and "save"."""
  total = (end - at) * costs["step"]
  for name in ("eval", "probe", "save"):
    every, each = costs.get(name, (0, 0.0))
    total += events(at, end, every) * each
  return total


def plan(left_seconds: float, at: int, floor: int, cap: int, costs: dict) -> int:
  """The most steps in [floor, cap] whose remaining time from step `at` fits `left_seconds` (`floor`
  when none does: the run then overruns)."""
  lo, hi = floor, cap
  if seconds_to(lo, at, costs) > left_seconds:
    return floor
  while lo < hi:   # the time grows with the steps: the last end that fits
    mid = (lo + hi + 1) // 2
    if seconds_to(mid, at, costs) <= left_seconds:
      lo = mid
    else:
      hi = mid - 1
  return lo


def replan(left_seconds: float, budget_seconds: float, at: int, end: int, cap: int, costs: dict,
           compile_seconds: float) -> int | None:
  """The steps to plan from step `at` of a run now ending at `end`, when the time it predicts to its end
  (`costs`, as in seconds_to) misses `left_seconds` by more than TOLERANCE of the budget; None when it does
  not, or when the new plan (which first compiles its schedule, `compile_seconds`) keeps `end`."""
  if abs(seconds_to(end, at, costs) - left_seconds) <= TOLERANCE * budget_seconds:
    return None
  steps = plan(left_seconds - compile_seconds, at, at + 1, cap, costs)
  return steps if steps != end else None


def check(train, warmup_steps: int, schedule: str, start: int) -> int:
  """The calibration's length for a run (re)starting at `start` without a decision: it must end inside
  the warmup (a constant schedule has nothing to wait for)."""
  k = int(train.budget_calibration_steps)
  if k < 1:
    raise UserError(f"train.budget_calibration_steps={k}: expected at least 1 timed step")
  if schedule != "constant":
    k = min(k, int(warmup_steps) - start - 1)
    if k < 1:
      raise UserError(f"train.time_budget_minutes needs its decision inside the warmup (the learning rate after it "
                      f"depends on the steps), but optimizer.warmup_steps={warmup_steps} leaves no step to time "
                      f"after the compile at step {start + 1}; raise optimizer.warmup_steps")
  return k


def floor(step: int, warmup_steps: int, schedule: str, cap: int) -> int:
  """The fewest steps a decision at `step` may fix: past it and, but for a constant schedule, not before the
  warmup's end (a shorter run would change the warmup the steps so far trained with); at most `cap`."""
  return min(max(step + 1, int(warmup_steps) if schedule != "constant" else 0), cap)
