"""train.time_budget_minutes: the plan against a direct count, and real runs of the loop whose decided
steps train exactly what a plain run of that many steps trains, across a stop and a resume; a plan made
again when the speed drifts (its schedule stretched), recorded and repeated by a resume."""
import json
import re
import subprocess
import sys

import pytest

from subproc import REPO, cpu_env

from mlm_jax.errors import ConfigError, UserError
from mlm_jax.training import time_budget


def _direct_seconds(end, at, costs):
  """Step by step: every step's time, and each cadence's cost at its multiples and at the end."""
  total = 0.0
  for s in range(at + 1, end + 1):
    total += costs["step"]
    for name in ("eval", "probe", "save"):
      every, each = costs.get(name, (0, 0.0))
      if (every > 0 and s % every == 0) or s == end:
        total += each
  return total


@pytest.mark.parametrize("costs", [
    dict(step=0.5, eval=(7, 3.0), probe=(10, 5.0), save=(4, 0.25)),
    dict(step=0.5, eval=(0, 3.0), save=(5, 1.0)),   # evaluation only at the end
    dict(step=1.0),
])
def test_the_plan_is_the_last_end_that_fits_counted_step_by_step(costs):
  at, floor, cap = 3, 9, 60
  for left in (0.0, 4.0, 11.0, 17.5, 30.0, 1e6):
    fits = [end for end in range(floor, cap + 1) if _direct_seconds(end, at, costs) <= left]
    assert time_budget.plan(left, at, floor, cap, costs) == (max(fits) if fits else floor), left
  for end in range(at, cap + 1):
    assert time_budget.seconds_to(end, at, costs) == pytest.approx(_direct_seconds(end, at, costs))


def test_a_stretched_schedule_spreads_what_is_left_over_the_new_steps():
  import jax.numpy as jnp
  import ml_collections
  from mlm_jax.training import optim
  o = ml_collections.ConfigDict(dict(schedule="linear", warmup_steps=10, learning_rate=1.0, end_lr_ratio=0.0))
  base = optim.make_schedule(o, 100)
  lr = lambda f, s: float(f(jnp.asarray(s, jnp.int32 if isinstance(s, int) else jnp.float32)))
  assert time_budget.stretch(base, 100, []) is base
  plans = [(40, 70), (55, 90)]   # slower: 100 -> 70 steps at step 40; faster again: 70 -> 90 at step 55
  f = time_budget.stretch(base, 100, plans)
  for s in range(0, 41):
    assert lr(f, s) == pytest.approx(lr(base, s), abs=1e-6)   # the steps trained before the first plan
  # step 40 stands at 40 of 100: 60 left over 30 steps (2 a step); step 55 then at 70: 30 left over 35 steps
  for s in range(41, 91):
    virtual = 40 + 2 * (s - 40) if s <= 55 else 70 + 30 / 35 * (s - 55)
    assert lr(f, s) == pytest.approx(lr(base, virtual), abs=1e-5), s
  assert lr(f, 90) == pytest.approx(0.0, abs=1e-6) and lr(f, 95) == pytest.approx(0.0, abs=1e-6)
  assert all(lr(f, s) > lr(f, s + 1) for s in range(10, 90))   # still decaying, and only at its end to 0


def test_the_steps_are_planned_again_only_when_the_end_misses_by_more_than_the_tolerance():
  costs = dict(step=1.0, eval=(10, 5.0))
  budget, at, end, cap = 1000.0, 100, 400, 800
  on_time = time_budget.seconds_to(end, at, costs)
  tol = time_budget.TOLERANCE * budget
  for left in (on_time, on_time + 0.9 * tol, on_time - 0.9 * tol):
    assert time_budget.replan(left, budget, at, end, cap, costs, 0.0) is None, left
  for left, compile_s in ((on_time - 2 * tol, 0.0), (on_time + 2 * tol, 0.0), (on_time + 2 * tol, 7.0), (5.0, 0.0)):
    steps = time_budget.replan(left, budget, at, end, cap, costs, compile_s)
    assert steps == time_budget.plan(left - compile_s, at, at + 1, cap, costs) and steps != end, left
  assert time_budget.replan(1e9, budget, at, end, cap, costs, 0.0) == cap   # at most the cap
  assert time_budget.replan(1e9, budget, at, cap, cap, costs, 0.0) is None  # at the cap already: nothing new


def test_the_decision_must_fall_inside_the_warmup():
  import ml_collections
  train = ml_collections.ConfigDict(dict(budget_calibration_steps=100))
  assert time_budget.check(train, 723, "linear", 0) == 100
  assert time_budget.check(train, 50, "linear", 0) == 49    # shortened to end inside the warmup
  assert time_budget.check(train, 0, "constant", 0) == 100  # nothing to wait for
  with pytest.raises(UserError, match="optimizer.warmup_steps=5 leaves no step to time"):
    time_budget.check(train, 5, "linear", 4)


# Real runs of the one loop (a 1-layer encoder on random tokens, tests/test_loop.py's), each in its own
# workdir; one process, so the budget counts from its start. Prints {workdir: [loss at each step]}.
_RUNS = """
import json, os, sys
from absl import logging
from mlm_jax import runtime
runtime.configure()
logging.set_verbosity(logging.INFO)
sys.path.insert(0, "tests")
from test_loop import RandomInput
from mlm_jax.config.defaults import default_config
from mlm_jax.model import sharding
from mlm_jax.training import loop, resolve, trainer as trainer_lib


def run(workdir, budget=0.0, steps=24, stop=0, replan=True, record=None, log_every=1, eval_every=6, save_every=4):
  if record is not None:   # a decision recorded by an earlier run of the workdir (or a copy of its record)
    os.makedirs(workdir, exist_ok=True)
    with open(f"{workdir}/time_budget.json", "w") as f:
      json.dump(record, f)
  c = default_config()
  c.model.update(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=16)
  c.data.seq_len = 16
  c.optimizer.update(warmup_steps=8, learning_rate=1e-2)
  c.train.update(steps=steps, batch_size=4, log_every=log_every, eval_every=eval_every, save_every=save_every,
                 stop_at_step=stop,
                 time_budget_minutes=budget, budget_calibration_steps=3, budget_replan=replan)
  r = resolve.resolve_for_compile(c)
  trainer = trainer_lib.make_trainer(r.config, sharding.make_mesh(r.config.mesh), r.objective)
  norm = lambda params, step: {"eval_norm": float(sum((x ** 2).sum() for x in jax.tree.leaves(params)))}
  loop.Loop(trainer, workdir, RandomInput(4), norm, trainer.init, tokens_per_example=16, flops_per_token=1.0).run()


import jax
root = sys.argv[1]
run(f"{root}/spent", budget=1e-4)                 # spent before it decides: the warmup's end plus one
run(f"{root}/plain8", steps=8)
run(f"{root}/ample", budget=60.0, stop=12)        # decides the cap, then stops at step 12
run(f"{root}/ample", budget=60.0)                 # and resumes to the decided end
run(f"{root}/plain24")
# Decided 400 steps, then the machine is too slow for any of them: at the first log line after the warmup (8)
# the steps are planned again, to the fewest (9), on any machine (the budget is spent at the process's start).
slow = dict(steps=400, decided_at_step=4, cap=400, budget_minutes=1e-5)
run(f"{root}/drift", budget=1e-5, steps=400, record=slow)
run(f"{root}/kept", budget=1e-5, steps=400, stop=12, replan=False, record=slow)
# A record that planned 400 -> 20 steps at step 12, run through, and stopped at 10 and resumed (an ample budget:
# no plan of their own).
planned = dict(slow, steps=20, decided_steps=400, replans=[dict(at_step=12, steps=20)])
run(f"{root}/planned", budget=60.0, steps=400, record=planned)
run(f"{root}/resumed", budget=60.0, steps=400, stop=10, record=planned)
run(f"{root}/resumed", budget=60.0, steps=400)
run(f"{root}/eta", steps=1000, log_every=20, eval_every=0, save_every=0)   # no budget: the ETA alone
out = {}
for name in ("spent", "plain8", "ample", "plain24", "drift", "kept", "planned", "resumed"):
  lines = [json.loads(l) for l in open(f"{root}/{name}/metrics.jsonl")]
  out[name] = {str(l["step"]): l["loss"] for l in lines if "loss" in l}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def budget_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("budget")
  proc = subprocess.run([sys.executable, "-c", _RUNS, str(root)], cwd=REPO, env=cpu_env(), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return root, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_spent_budget_ends_after_the_warmup_as_a_plain_run_of_that_length(budget_runs):
  root, losses, log = budget_runs
  record = json.loads((root / "spent" / "time_budget.json").read_text())
  # timed steps 2..4 after the compiling first step: decided at step 4; nothing left, so the floor (warmup 8)
  assert record["decided_at_step"] == 4 and record["steps"] == 8 and record["cap"] == 24
  assert record["predicted_seconds"] > 60 * record["budget_minutes"]
  assert "over the budget" in log
  assert sorted(losses["spent"], key=int) == [str(s) for s in range(1, 9)]
  assert losses["spent"] == losses["plain8"]   # the same losses, bit for bit: a plain 8-step run's
  config = json.loads((root / "spent" / "config.json").read_text())
  assert config["config"]["train"]["steps"] == 8   # what the run trains (the binaries: under "derived")


def test_an_ample_budget_takes_the_cap_and_a_resume_keeps_the_decision(budget_runs):
  root, losses, log = budget_runs
  record = json.loads((root / "ample" / "time_budget.json").read_text())
  assert record["steps"] == 24 and record["decided_at_step"] == 4
  assert record["step_seconds"] > 0 and record["eval_seconds"] > 0
  assert record["predicted_seconds"] < 3600
  assert "time budget: 24 steps, fixed at step 4" in log   # the resumed run read the record
  assert sorted(losses["ample"], key=int) == [str(s) for s in range(1, 25)]
  assert losses["ample"] == losses["plain24"]
  evals = [json.loads(l)["step"] for l in (root / "ample" / "metrics.jsonl").read_text().splitlines()
           if "eval_norm" in l]
  assert evals == [4, 6, 12, 18, 24]   # the timed evaluation at the decision, then the cadence's


def test_a_drifted_run_plans_again_and_keeps_its_first_decision_when_told_to(budget_runs):
  root, losses, log = budget_runs
  record = json.loads((root / "drift" / "time_budget.json").read_text())
  assert record["steps"] == 9 and record["decided_steps"] == 400 and record["cap"] == 400
  assert [(r["at_step"], r["steps"]) for r in record["replans"]] == [(8, 9)]
  assert record["replans"][0]["predicted_seconds"] > 60 * 1e-5
  assert "train.steps = 9 (was 400)" in log
  assert sorted(losses["drift"], key=int) == [str(s) for s in range(1, 10)]
  assert json.loads((root / "drift" / "config.json").read_text())["config"]["train"]["steps"] == 9
  # train.budget_replan=False: the first decision holds (to its stop at 12), nothing planned again
  assert sorted(losses["kept"], key=int) == [str(s) for s in range(1, 13)]
  assert "replans" not in json.loads((root / "kept" / "time_budget.json").read_text())


def test_a_recorded_plan_stretches_the_schedule_and_a_resume_repeats_it(budget_runs):
  root, losses, log = budget_runs
  assert "planned again at step 12: 20" in log   # the resumed run read it
  assert sorted(losses["planned"], key=int) == [str(s) for s in range(1, 21)]
  assert losses["resumed"] == losses["planned"]   # bit for bit, across the stop at 10, before the plan
  rates = {l["step"]: l["learning_rate"] for l in map(json.loads, (root / "planned" / "metrics.jsonl").read_text()
                                                       .splitlines()) if "learning_rate" in l}
  # Step s trains at the schedule's rate of step x = s - 1: the 400-step schedule's (warmup 8, then 392 steps
  # from the peak 1e-2 to 0) up to step 12; there it stands at 4 of its 392, and the 388 left take 8 steps.
  for s in range(1, 21):
    x = s - 1
    done = x - 8 if x <= 12 else 4 + 388 * (x - 12) / 8
    assert rates[s] == pytest.approx(1e-2 * (x / 8 if x < 8 else 1 - done / 392), rel=1e-4, abs=1e-9), s


def test_the_eta_leaves_the_compile_out_of_the_pace(budget_runs):
  """The console's ETA is the budget's cost model (the steps' pace since the compile). It was the pace since the
  loop began, compile included, so a 1-hour run read 'ETA 06:29:44' at step 100 and this run's first line (step
  20 of 1000) read 49 compiles. Now that line is within 3x of the 980 steps' own time (goodput's steps and
  input seconds of the run), on a fast or a loaded machine alike."""
  root, _, log = budget_runs
  lines = re.findall(r"step (\d+)/1000 .*ETA (\d+):(\d\d):(\d\d)", log)
  eta = {int(s): 3600 * int(h) + 60 * int(m) + int(sec) for s, h, m, sec in lines}
  assert sorted(eta) == list(range(20, 1001, 20)), sorted(eta)
  seconds = json.loads((root / "eta" / "goodput.json").read_text())["segments"][0]["seconds"]
  rest = (seconds["step"] + seconds["input"]) * 980 / 999   # the steps after the compiling first one
  assert rest / 3 - 1 <= eta[20] <= 3 * rest + 1, (eta[20], rest, seconds["compile"])
  assert eta[1000] == 0


def test_a_budget_with_phases_is_refused_before_any_work(tmp_path):
  from mlm_jax.config.defaults import default_config
  from mlm_jax.training import resolve
  c = default_config()
  c.phases = ({"name": "a", "end_step": 8},)
  c.train.time_budget_minutes = 60.0
  with pytest.raises(ConfigError, match="train.time_budget_minutes with config.phases") as e:
    resolve.settle(c, str(tmp_path))   # what the binary checks before it trains a tokenizer
  assert "\n" not in str(e.value) and not any(tmp_path.iterdir())


def test_a_budget_in_fine_tuning_is_refused_before_any_work(tmp_path):
  from mlm_jax.config.finetune_defaults import finetune_config
  from mlm_jax.training import provision
  c = finetune_config()
  c.train.time_budget_minutes = 10.0
  with pytest.raises(ConfigError, match="give train.steps for fine-tuning") as e:
    provision.finetuning(c, str(tmp_path), init_from=str(tmp_path / "no_such_model"))   # refused before the source
  assert "\n" not in str(e.value) and not any(tmp_path.iterdir())


def test_an_unreadable_record_is_named_and_kept(tmp_path):
  (tmp_path / "time_budget.json").write_text("{not json")
  with pytest.raises(UserError, match=r"time_budget.json: unreadable .*expected the step count"):
    time_budget.read(str(tmp_path))
  assert (tmp_path / "time_budget.json").read_text() == "{not json"


def test_two_processes_of_the_binary_end_at_the_one_decided_step_and_plan_again_together(tmp_path,
                                                                                        corpus_and_tokenizer):
  """The real binary on 2 processes (jax.distributed on localhost): process 0's decision and later plan are
  every process's, and config.json keeps the user's cap beside the derived steps. The budget is spent before
  the decision, so the verdicts are the warmup's end and the fewest steps whatever the machine's speed."""
  from test_multihost import Job
  from test_train import RUNS_ON, _losses
  wd = tmp_path / "pod"
  job = Job(2, wd, corpus_and_tokenizer, "--config.train.time_budget_minutes=0.0001",
            "--config.train.budget_calibration_steps=2", "--config.optimizer.warmup_steps=6", logs=tmp_path, leg="budget")
  assert job.wait() == [0, 0], job.stderr(0)[-3000:]
  record = json.loads((wd / "time_budget.json").read_text())
  assert (record["decided_at_step"], record["steps"], record["cap"]) == (3, 6, RUNS_ON)
  assert sorted(_losses(wd)) == list(range(1, 7))
  assert f"train.steps = 6 (at most {RUNS_ON})" in job.stderr(0), job.stderr(0)[-3000:]   # process 1 logs less
  config = json.loads((wd / "config.json").read_text())
  assert config["config"]["train"]["steps"] == RUNS_ON and config["derived"]["train"]["steps"] == 6
  # As if it had decided 12 steps on a faster machine: resumed here from step 6, the two processes plan again
  # at the one log line process 0's clock picks (the first timed one after a step of the new run: 8), to 9.
  record.update(steps=12, decided_steps=12)
  (wd / "time_budget.json").write_text(json.dumps(record))
  job = Job(2, wd, corpus_and_tokenizer, "--config.train.time_budget_minutes=0.0001",
            "--config.train.budget_calibration_steps=2", "--config.optimizer.warmup_steps=6", logs=tmp_path, leg="replan")
  assert job.wait() == [0, 0], job.stderr(0)[-3000:]
  record = json.loads((wd / "time_budget.json").read_text())
  assert [(r["at_step"], r["steps"]) for r in record["replans"]] == [(8, 9)] and record["steps"] == 9
  assert sorted(_losses(wd)) == list(range(1, 10))
  assert "train.steps = 9 (was 12)" in job.stderr(0), job.stderr(0)[-3000:]
