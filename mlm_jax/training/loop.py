"""The one training loop: pretraining, fine-tuning and every objective end here.

It owns what every run needs and nothing an objective decides: restore or start, the step, logging
with one host sync per `log_every`, evaluation and probes, checkpoints with the input's position,
and preemption (SIGTERM on any host: every host saves one agreed step and stops;
training/preemption.py). What each cadence does: docs/design_notes.md#loop.
It also accounts the run's wall time (goodput, workdir/goodput.py), traces `train.profile_steps` and,
with `train.time_budget_minutes`, fixes the run's steps from its measured speed and plans them again when
that drifts (training/time_budget.py).
What a log line holds and the non-finite policy: training/log_interval.py; train.best_metric's copy of the
best parameters: training/best_checkpoint.py.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Protocol

import jax
import ml_collections
import numpy as np
from absl import logging

from mlm_jax import runtime
from mlm_jax.errors import PeerLost, UserError
from mlm_jax.model import sharding
from mlm_jax.training import optim, preemption, profiling, time_budget, trainer as trainer_lib
from mlm_jax.training.best_checkpoint import BestCheckpoint
from mlm_jax.training.log_interval import LogInterval
from mlm_jax.workdir import branch as branch_lib, checkpoints, files as workdir_files, goodput, migrate, restore
from mlm_jax.workdir.metrics_log import MetricsWriter


class Input(Protocol):
  """What the loop reads: this process's rows of global batch `step`, and a position to save."""

  def batch(self, step: int) -> dict: ...
  # Optionally also `metrics() -> dict`: input figures for the log line (a store's epochs and tokens).
  # And `adopted_config() -> dict`: config fields a resumed input took from its checkpoint (config.json),
  # and `resume_facts() -> dict`: what workdir/migrate.data_state needs to upgrade an earlier data state.
  def get_state(self) -> dict: ...
  def set_state(self, state: dict) -> None: ...


Evaluator = Callable[[Any, int], dict]   # (params, step) -> held-out metrics {"eval_...": float}


@dataclasses.dataclass
class Loop:
  trainer: Any                           # trainer.Trainer
  workdir: str
  input: Input
  evaluate: Evaluator | None
  init_state: Callable[[], Any]          # a fresh TrainState when there is no checkpoint
  tokens_per_example: int
  flops_per_token: float
  best_metric: str = ""                  # e.g. "eval_accuracy": keep the best parameters in WORKDIR/best
  probe: Evaluator | None = None         # (params, step) -> {"probe/...": float}, every train.probe_every steps
  # A run in phases (training/phase_runner.PhaseSet): the trainer, input and evaluators above are then
  # each phase's, set when it begins; `trainer` is phase 0's until then.
  phases: Any = None
  # The config as the user gave it (resolve.Resolved.user): config.json keeps it apart from what resolution
  # derived; None: the trainer's config is recorded as the user's.
  user_config: ml_collections.ConfigDict | None = None
  preempted: bool = False                # after run(): whether preemption ended it
  stopped_at: int = 0                    # after run(): the last step trained (and saved, when preempted)
  _phase: Any = None                     # the current phase's PhaseParts
  _best: Any = None                      # BestCheckpoint, when best_metric is set (made by run())
  _decide_at: int | None = None          # train.time_budget_minutes: the step that fixes train.steps (run())
  _plan: dict | None = None              # and then the plans: decided_steps, cap, replans [(at, steps)], at_step
  _window: tuple | None = None           # (time, step, eval/probe/save seconds) since the last compile: the pace
  _asides: dict = dataclasses.field(default_factory=dict)   # seconds of this process's last evaluation and probe
  _saves: int = 0                        # checkpoints this process has written (a save's cost, for the budget)
  _compiles: int = 0                     # steps this process compiled (a compile's cost, for a new plan)

  @property
  def train_config(self) -> ml_collections.ConfigDict:
    return self.trainer.config.train

  @property
  def end_step(self) -> int:
    """Where this run stops: train.stop_at_step when set (and before the end), else train.steps."""
    t = self.train_config
    stop = int(t.get("stop_at_step", 0) or 0)
    return min(stop, int(t.steps)) if stop > 0 else int(t.steps)

  @property
  def phase_name(self) -> str:
    return self._phase.name if self._phase is not None else ""

  def _enter_phase(self, k: int, saved: dict | None) -> None:
    """Phase k's trainer, input and evaluators; its input continues from `saved` when that is its own."""
    p = self._phase = self.phases.enter(k)
    self.trainer, self.input, self.evaluate, self.probe = p.trainer, p.input, p.evaluate, p.probe
    self.tokens_per_example, self.flops_per_token = p.tokens_per_example, p.flops_per_token
    if saved is not None and saved.get("phase") == p.name:
      self._resume_input(saved)
    elif saved is not None:
      logging.info("phase %r begins after the restored step: its input starts at its beginning", p.name)

  def run(self) -> dict:
    """Trains from the latest checkpoint (or fresh) to train.steps; returns the last logged metrics."""
    t = self.train_config
    gp = self._goodput = goodput.Recorder(self.workdir, enabled=jax.process_index() == 0)
    checkpointer = checkpoints.Checkpointer(self.workdir, keep=t.keep_checkpoints)
    self._best = BestCheckpoint(self.workdir, self.best_metric) if self.best_metric else None
    state = self._start(checkpointer)   # a checkpoint of another config fails here, before anything is written
    start = int(jax.device_get(state.step))
    self._decide_at = self._time_budget(start)
    self._write_config()
    writer = MetricsWriter(self.workdir, enabled=jax.process_index() == 0, truncate_after=start)
    watch = preemption.Preemption(t.sigterm_timeout_s, start, checkpointer.wait)
    logging.info("training steps %d..%s%d, global batch %d x %d tokens, mesh %s, %.2fM parameters", start,
                 "at most " if self._decide_at else "", self.end_step, t.batch_size, self.tokens_per_example,
                 dict(self.trainer.mesh.shape),
                 sum(x.size for x in jax.tree.leaves(state.params)) / 1e6)
    gp.begin_steps(start, writer.max_step_before)
    status, self._profiler, lost = "error", None, False
    try:
      last = self._steps(state, start, checkpointer, writer, watch)
      status = "preempted" if watch.preempted else "finished"
    except Exception as e:
      lost = runtime.peer_lost(e)   # then a save being written cannot complete: nothing waits for it
      if lost:
        raise PeerLost(str(e)) from None
      raise
    finally:   # also on an error: a save still being written finishes, and is not lost
      watch.stop()
      if not lost:
        self._close(checkpointer, writer, status)
    self.preempted, self.stopped_at = watch.preempted, gp.step
    return last

  def _write_config(self) -> None:
    base = self.phases.configs[-1] if self.phases is not None else self.trainer.config   # phases: the last one's
    workdir_files.write_config(self._config_as_run(base), self.workdir, self.user_config)

  def _time_budget(self, start: int) -> int | None:
    """train.time_budget_minutes: the steps a recorded decision fixed, or the step that will decide them."""
    t = self.train_config
    if time_budget.minutes(t) <= 0:
      return None
    if self.phases is not None or self.trainer.description is None:
      raise UserError("train.time_budget_minutes: a budget fixes the steps of a pretraining run without "
                      "config.phases; give train.steps here instead")
    record = time_budget.read(self.workdir)
    if record is not None:
      plans = time_budget.replans(record)
      self._set_plan(dict(decided_steps=time_budget.first_steps(record), cap=int(record.get("cap", t.steps)),
                          replans=plans, at_step=max([int(record.get("decided_at_step", 0))] + [a for a, _ in plans])))
      logging.info("time budget: %d steps, fixed at step %d of this run%s (%s)", self.train_config.steps,
                   record.get("decided_at_step", 0),
                   "".join(f", planned again at step {a}: {n}" for a, n in plans), time_budget.FILE)
      return None
    o = self.trainer.config.optimizer
    decide_at = start + 1 + time_budget.check(t, o.warmup_steps, o.schedule, start)
    logging.info("time budget %.1f min: the steps are fixed after timing steps %d..%d", float(t.time_budget_minutes),
                 start + 2, decide_at)
    return decide_at

  def _set_plan(self, plan: dict) -> None:
    """The run's trainer for `plan`: its schedule made for the decided steps, stretched by each replan
    (time_budget.stretch) to end at the last one's steps; compiled on first use."""
    self._plan = plan
    config = ml_collections.ConfigDict(self.trainer.config.to_dict())
    config.train.steps = plan["replans"][-1][1] if plan["replans"] else plan["decided_steps"]
    t = self.trainer
    schedule = None
    if plan["replans"]:
      first = plan["decided_steps"]
      schedule = time_budget.stretch(optim.make_schedule(config.optimizer, first), first, plan["replans"])
    self.trainer = trainer_lib.make_trainer(ml_collections.FrozenConfigDict(config), t.mesh, t.description,
                                            schedule=schedule)

  def _costs(self, state, step: int) -> dict:
    """_cost_model once `state`'s step has finished: the planner's timing ends with the step, not its dispatch."""
    jax.block_until_ready(state.step)
    return self._cost_model(step)

  def eta_seconds(self, step: int) -> float | None:
    """Seconds to the end by the model the time budget plans with: the steps' pace since the last compile,
    evaluations, probes and saves by their cadence (a compile or a one-off evaluation does not stretch the
    rest of the run); None before a step since the last compile is timed. After a log line's host sync."""
    if self._window is None or step <= self._window[1]:
      return None
    return time_budget.seconds_to(self.end_step, step, self._cost_model(step))

  def _cost_model(self, step: int) -> dict:
    """Seconds a step since the window began (evaluations, probes and saves apart), and each cadence's
    (every, seconds each): the last evaluation's and probe's, a save's on average; for time_budget.seconds_to."""
    t, gp = self.train_config, self._goodput
    t_from, step_from, aside = self._window
    costs = {"step": (time.perf_counter() - t_from - (self._aside_seconds() - aside)) / (step - step_from)}
    for name, every in (("eval", t.eval_every), ("probe", t.probe_every)):
      if name in self._asides:
        costs[name] = (int(every), self._asides[name])
    costs["save"] = (int(t.save_every), gp.seconds["save"] / self._saves if self._saves else 0.0)
    return costs

  def _decide_steps(self, state, step: int, writer: MetricsWriter) -> None:
    """Times one evaluation and probe, then fixes train.steps to the most that fit the budget's rest."""
    t, gp = self.train_config, self._goodput
    step_seconds = self._costs(state, step)["step"]
    for name, run_it in (("eval", self.evaluate and self._eval), ("probe", self.probe and self._probe)):
      if run_it:
        with gp.phase(name):
          run_it(state, step, writer)
    costs = dict(self._costs(state, step), step=step_seconds)
    budget = 60.0 * float(t.time_budget_minutes)
    elapsed, compile_s = gp.wall_seconds(), gp.seconds["compile"]   # the new schedule compiles once more
    o = self.trainer.config.optimizer
    floor = time_budget.floor(step, o.warmup_steps, o.schedule, int(t.steps))
    steps = time_budget.plan(budget * (1 - time_budget.MARGIN) - elapsed - compile_s, step, floor, int(t.steps), costs)
    if jax.process_count() > 1:   # process 0's clock decides for all (only it has the earlier runs' record)
      from jax.experimental import multihost_utils
      steps = int(multihost_utils.broadcast_one_to_all(np.int32(steps)))
    predicted = elapsed + compile_s + time_budget.seconds_to(steps, step, costs)
    if jax.process_index() == 0:
      time_budget.write(self.workdir, dict(
          steps=steps, decided_steps=steps, decided_at_step=step, budget_minutes=float(t.time_budget_minutes),
          cap=int(t.steps), replans=[],
          elapsed_seconds=elapsed, step_seconds=costs["step"], compile_seconds=compile_s,
          **{f"{k}_seconds": costs[k][1] for k in ("eval", "probe", "save") if k in costs},
          predicted_seconds=predicted))
    self._set_plan(dict(decided_steps=steps, cap=int(t.steps), replans=[], at_step=step))
    self._write_config()
    logging.info("time budget %.1f min: %.1f min spent at step %d, %.4f s a step: train.steps = %d (at most %d), "
                 "%.1f min in all by the plan%s", float(t.time_budget_minutes), elapsed / 60, step, costs["step"],
                 steps, int(t.steps), predicted / 60,
                 "" if predicted <= budget else f" (over the budget: the run cannot end before step {floor})")

  def _replan(self, state, step: int) -> bool:
    """train.budget_replan: at a log line past the warmup and WINDOW of the budget timed since the last plan,
    plans the steps again when the end now predicted misses the budget by more than TOLERANCE of it
    (time_budget.replan); records the plan before any step trains under it. True when it did."""
    t, gp, plan = self.train_config, self._goodput, self._plan
    o = self.trainer.config.optimizer
    if (plan is None or not t.get("budget_replan", True) or step <= plan["at_step"]
        or (o.schedule != "constant" and step < int(o.warmup_steps)) or self._window is None
        or step <= self._window[1]):
      return False
    budget = 60.0 * float(t.time_budget_minutes)
    steps = -1
    if jax.process_index() == 0:
      costs = self._costs(state, step)
      timed = (step - self._window[1]) * costs["step"]
      if timed >= time_budget.WINDOW * budget:
        left = budget * (1 - time_budget.MARGIN) - gp.wall_seconds()
        compile_s = gp.seconds["compile"] / max(1, self._compiles)   # the new schedule compiles once more
        steps = time_budget.replan(left, budget, step, int(t.steps), plan["cap"], costs, compile_s) or -1
    if jax.process_count() > 1:   # process 0's clock decides for all, at the same log line
      from jax.experimental import multihost_utils
      steps = int(multihost_utils.broadcast_one_to_all(np.int32(steps)))
    if steps < 0:
      return False
    before = int(t.steps)
    new = dict(plan, replans=plan["replans"] + [(step, steps)], at_step=step)
    if jax.process_index() == 0:
      record = time_budget.read(self.workdir) or {}
      predicted = gp.wall_seconds() + compile_s + time_budget.seconds_to(steps, step, costs)
      record.update(steps=steps, decided_steps=plan["decided_steps"], replans=record.get("replans", []) + [dict(
          at_step=step, steps=steps, step_seconds=costs["step"], elapsed_seconds=gp.wall_seconds(),
          predicted_seconds=predicted)])
      time_budget.write(self.workdir, record)
      logging.info("time budget %.1f min: %.1f min spent at step %d, %.4f s a step since step %d: train.steps = %d "
                   "(was %d), %.1f min in all by the new plan", float(t.time_budget_minutes), gp.wall_seconds() / 60,
                   step, costs["step"], self._window[1], steps, before, predicted / 60)
    self._set_plan(new)
    self._write_config()
    return True

  def _aside_seconds(self) -> float:
    """This process's seconds so far in evaluations, probes and saves (not a step's time)."""
    return sum(self._goodput.seconds[k] for k in ("eval", "probe", "save"))

  def _close(self, checkpointer: checkpoints.Checkpointer, writer: MetricsWriter, status: str) -> None:
    gp = self._goodput
    if self._profiler is not None:
      self._profiler.close()
    with gp.phase("save"):
      checkpointer.close()
      if self._best is not None:
        self._best.checkpointer.close()
    writer.close()
    summary = gp.close(gp.step, status)
    if summary:
      logging.info("%s", summary)

  def _start(self, checkpointer: checkpoints.Checkpointer):
    latest = checkpointer.latest_step()
    source = None
    if latest is None and self.trainer.config.get("branch_from", ""):   # a branch's first start
      workdir, latest = branch_lib.parse(self.trainer.config.branch_from)
      source = checkpoints.Checkpointer(workdir, read_only=True)
    if latest is None:
      state = self.init_state()
      if self.phases is not None:
        self._enter_phase(self.phases.index_at(0), None)
      return state
    abstract = restore.abstract_with_shardings(jax.eval_shape(self.trainer.init), self.trainer.state_sharding)
    with self._goodput.phase("restore"):
      if source is not None:
        try:
          state, saved = restore.restore_state(source, latest, abstract)
        finally:
          source.close()
      else:
        latest, state, saved = restore.restore_newest(
            checkpointer, abstract, self.train_config.get("on_corrupt_checkpoint", "fallback"))
    if self.phases is not None:
      self._enter_phase(self.phases.index_at(latest), saved)
    else:
      self._resume_input(saved)
    if self._best is not None:
      self._best.set_state(saved)
    if source is not None:
      logging.info("branching from %s (step %d of that run)", self.trainer.config.branch_from, latest)
    else:
      logging.info("resuming from step %d", latest)
    return state

  def _resume_input(self, saved: dict) -> None:
    """The input continues from the restored data state, brought to today's form first (workdir/migrate.py)."""
    facts = getattr(self.input, "resume_facts", dict)()
    self.input.set_state(migrate.data_state(saved, **facts))

  def _config_as_run(self, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`base` with the fields the resumed input took from its checkpoint (a run started on
    next-fit rows records data.packing_fit='next'), so config.json says what the run reads."""
    adopted = getattr(self.input, "adopted_config", dict)()
    if not adopted:
      return base
    config = ml_collections.ConfigDict(base.to_dict())
    for dotted, value in adopted.items():
      section, field = dotted.rsplit(".", 1)
      config[section][field] = value
    return config

  def _saved_state(self) -> dict:
    phase = {"phase": self.phase_name} if self._phase is not None else {}
    return {**self.input.get_state(), **phase, **(self._best.get_state() if self._best is not None else {})}

  def _eval(self, state, step: int, writer: MetricsWriter) -> dict:
    t0 = time.perf_counter()
    ev = self.evaluate(state.params, step)
    if getattr(state, "ema", None) is not None:   # train.ema_decay: the average beside the raw weights
      ev.update({f"eval_ema_{k[5:]}": v for k, v in self.evaluate(state.ema, step).items()})
    writer.write(dict(step=step, **ev, **({"phase": self.phase_name} if self._phase is not None else {})))
    logging.info("step %d  eval %s", step, "  ".join(f"{k[5:]} {v:.4f}" for k, v in ev.items()))
    if self._best is not None:
      self._best.update(state, step, ev)
    self._asides["eval"] = time.perf_counter() - t0
    return ev

  def _probe(self, state, step: int, writer: MetricsWriter) -> dict:
    t0 = time.perf_counter()
    result = self.probe(state.params, step)
    writer.write(dict(step=step, **result))
    logging.info("step %d  %s", step, "  ".join(f"{k} {v:.3f}" for k, v in result.items()))
    self._asides["probe"] = time.perf_counter() - t0
    return result

  def _steps(self, state, start: int, checkpointer, writer: MetricsWriter, watch: preemption.Preemption) -> dict:
    t, gp = self.train_config, self._goodput   # self.trainer: the current phase's
    key = jax.random.key(self.trainer.config.seed)
    if watch.stopped_at_start():
      logging.warning("preempted before step %d: nothing new to save", start + 1)
      return {}
    if self.evaluate is not None and t.eval_at_start and start == 0:
      with gp.phase("eval"):
        self._eval(state, 0, writer)
    if self.probe is not None and t.eval_at_start and start == 0:
      with gp.phase("probe"):
        self._probe(state, 0, writer)
    log = LogInterval(self, gp)
    last, step, m, recompile = {}, start, None, False
    prof = self._profiler = profiling.StepProfiler(t, self.workdir, start)
    end = self.end_step
    while step < end:
      if self._phase is not None and step >= self._phase.end:   # a boundary: the next phase's step and input
        self._enter_phase(self.phases.index_at(step), None)
        log.restart()
        self._window = None   # its step compiles
      watch.phase = "input"
      prof.begin(step)
      t0 = time.perf_counter()
      batch = sharding.global_batch(self.input.batch(step), self.trainer.batch_sharding)
      t1 = time.perf_counter()
      prof.input_done()
      log.input_seconds += t1 - t0
      gp.seconds["input"] += t1 - t0
      watch.phase = "step"
      state, m = self.trainer.train_step(state, batch, key, self.trainer.values)
      checkpointer.check()   # a save that failed in the background stops the run now, in one line
      if step == start or (self._phase is not None and step == self._phase.phase.start) or recompile:   # compiling it
        gp.seconds["compile"] += time.perf_counter() - t1
        self._compiles += 1
      recompile = False
      log.add(m)
      step += 1
      gp.step = step
      prof.end(step, state)
      stop = watch.stop_at(step)   # several processes: true at the one step all of them agreed on
      final = step == end or stop
      boundary = self._phase is not None and step == self._phase.end   # rates of a phase are its own
      if _every(step, t.log_every) or final or boundary:
        last = log.flush(step, writer)
        gp.mark(step)
      decided = False
      if self._window is None:   # compiled: timed from here (the ETA, the time budget)
        jax.block_until_ready(state.step)
        self._window = (time.perf_counter(), step, self._aside_seconds())
      if self._decide_at is not None and step == self._decide_at and not stop:
        self._decide_steps(state, step, writer)
        self._decide_at, decided = None, True
      planned = decided or (_every(step, t.log_every) and not final and not stop and self._replan(state, step))
      if planned:   # the new schedule compiles at the next step, whose time the next window leaves out
        recompile, self._window = True, None
        t, end = self.train_config, self.end_step
        log.restart()
      if self.evaluate is not None and (_every(step, t.eval_every) or step == end or boundary) and not stop and not decided:
        watch.phase = "input"
        with gp.phase("eval"):
          last.update(self._eval(state, step, writer))
        log.restart()   # evaluation time is not training throughput
      if self.probe is not None and (_every(step, t.probe_every) or step == end) and not stop and not decided:
        watch.phase = "input"
        with gp.phase("probe"):
          last.update(self._probe(state, step, writer))
        log.restart()
      stop = stop or watch.requested()   # one process: SIGTERM may come during eval
      if _every(step, t.save_every) or step == end or stop:
        watch.phase = "save"
        with gp.phase("save"):
          self._save(checkpointer, state, m, step)
        gp.mark(step)
      if stop:
        logging.warning("preempted: saved step %d%s", step,
                        f" on all {jax.process_count()} processes" if watch.several_processes else "")
        break
    return last

  def _save(self, checkpointer, state, metrics, step: int) -> None:
    """A skipped non-finite step leaves the parameters as they were (train.nonfinite='skip'), so its state
    is saved like any other; train.nonfinite='stop' refuses it."""
    finite = float(jax.device_get(metrics["finite"]))
    if not finite and self.train_config.nonfinite == "stop":
      raise UserError(f"the loss or parameters are not finite at step {step}: refusing to write a "
                      "checkpoint; the last checkpoint is intact. Lower optimizer.learning_rate")
    if checkpoints.all_finite(state.params):
      checkpointer.save(step, state, self._saved_state())
      self._saves += 1
    else:
      logging.warning("step %d: parameters not finite, checkpoint not written", step)


def _every(step: int, interval: int) -> bool:
  """Whether `step` is on an interval's cadence; 0 (or less) means never (the last step still counts)."""
  return interval > 0 and step % interval == 0
