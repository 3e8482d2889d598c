"""A wall-time budget (`train.time_budget_minutes`): the run's steps fixed once from its measured speed.

A budget in minutes is what a "one hour on this machine" recipe means, and a fixed step count sized on
one machine overruns on a slower one. Cramming (Geiping & Goldstein, 2023) makes the schedule a function
of elapsed time; that would make the learning rate depend on the clock, so a resumed run could not repeat
an uninterrupted one. Here the clock is read once instead: after `train.budget_calibration_steps` steps
past the compile, and one timed evaluation and probe, the loop picks the most steps whose time, with the
evaluations, probes and saves on their cadences, fits what is left of the budget, and writes that count to
WORKDIR/time_budget.json. From then on the run is a plain run of that many steps: the decay ends at its
last step, and a resume (or a rerun with `train.steps` set to it) trains exactly the same steps. The
decision falls inside the warmup, whose learning rate does not depend on the length, so the steps before
it are those of the plain run too.

The time counted is goodput's (workdir/goodput.py): every run of the workdir from its process's start
(tokenizer training and start-up included) to now, without the time between runs. A machine that slows
down after the decision overruns the budget; the decision is not revisited.
"""
from __future__ import annotations

import json
import os

from mlm_jax import paths
from mlm_jax.errors import UserError

FILE = "time_budget.json"
MARGIN = 0.01   # of the budget, kept for what no cadence covers (the final wait for the last save)


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
  except (ValueError, KeyError, TypeError, OSError) as e:
    raise UserError(f"{path}: unreadable ({e}); expected the step count a time budget fixed, "
                    '{"steps": N, ...}. Restore it, or delete it to decide again') from None
  return record


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
