"""The one loop's SIGTERM watchdog: a run stalled in its input still ends soon after SIGTERM, with no
checkpoint newer than its last complete step."""
import json
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from subproc import REPO, cpu_env


def tiny_trainer(devices, **train):
  """A 1-layer, 16-wide encoder on a 64-piece vocabulary, its Trainer on `devices` (None: all)."""
  from mlm_jax.training import resolve, trainer as trainer_lib
  from mlm_jax.model import sharding
  from mlm_jax.config.defaults import default_config
  c = default_config()
  c.model.update(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=16)
  c.data.seq_len = 16
  c.train.update(train)
  run = resolve.resolve_for_compile(c)
  return trainer_lib.make_trainer(run.config, sharding.make_mesh(run.config.mesh, devices), run.objective)


def random_batch(i: int, rows: int, seq: int = 16) -> dict:
  """Random tokens of a 64-piece vocabulary, one document a row (batch i of a run's input)."""
  ids = np.random.default_rng(i).integers(4, 63, (rows, seq)).astype(np.int32)
  return dict(input_ids=ids, segment_ids=np.ones_like(ids), word_starts=np.ones_like(ids),
              positions=np.tile(np.arange(seq, dtype=np.int32), (rows, 1)))


class RandomInput:
  """The loop's input of random_batch rows: batch i is a function of i alone, so there is no position to keep."""

  def __init__(self, rows: int):
    self.rows = rows

  def batch(self, i):
    return random_batch(i, self.rows)

  def get_state(self):
    return {}

  def set_state(self, state):
    pass


# A tiny encoder trained by the real loop on random tokens; its input blocks forever at step 5.
_STALLING_RUN = """
import sys, threading
from mlm_jax import runtime
runtime.configure()
sys.path.insert(0, "tests")
from test_loop import random_batch, tiny_trainer
from mlm_jax.training import loop

trainer = tiny_trainer(None, steps=100, batch_size=4, log_every=1, save_every=2, sigterm_timeout_s=3.0)


class Stalling:
  def batch(self, i):
    if i == 5:
      print("stalled", flush=True)
      threading.Event().wait()   # an input that never comes (a hung file system)
    return random_batch(i, 4)

  def get_state(self):
    return {}

  def set_state(self, state):
    pass


loop.Loop(trainer, sys.argv[1], Stalling(), None, trainer.init, tokens_per_example=16, flops_per_token=1.0).run()
"""


def test_sigterm_during_an_input_stall_exits_without_a_newer_checkpoint(tmp_path):
  proc = subprocess.Popen([sys.executable, "-c", _STALLING_RUN, str(tmp_path)], cwd=REPO, env=cpu_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "stalled", proc.stderr.read()[-2000:]
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
  finally:
    proc.kill()
  assert time.monotonic() - t0 < 20
  assert proc.returncode == 1 and "preempted: the run is stuck in input" in err, err[-2000:]
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps and max(steps) == 4, steps   # saved every 2 steps; step 6 waits for batch 5 forever
  logged = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert max(logged) == 5


def test_zero_cadences_and_an_error_at_the_end_keep_the_saved_checkpoint(tmp_path):
  """log/eval/save_every=0 mean 'only at the last step'; an evaluation that fails there (a store
  without eval documents) still lets the asynchronous save of step 2 finish: saved work is not lost."""
  import jax
  import pytest
  from mlm_jax.training import loop
  from mlm_jax.errors import DataError

  trainer = tiny_trainer(jax.devices()[:1], steps=4, batch_size=2, log_every=0, eval_every=0, save_every=2)
  evaluated = []

  def failing_eval(params, at):
    evaluated.append(at)
    raise DataError("no eval documents")

  with pytest.raises(DataError):
    loop.Loop(trainer, str(tmp_path), RandomInput(2), failing_eval, trainer.init, tokens_per_example=16,
              flops_per_token=1.0).run()
  assert evaluated == [4]
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2"]
  assert (tmp_path / "checkpoints" / "2" / "commit_success.txt").exists()
  logged = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert logged == [4]


def test_a_skipped_step_at_a_save_boundary_is_saved(tmp_path):
  """train.nonfinite='skip' leaves the parameters of a non-finite step as they were, so the state of a
  skipped step is as good as the last one's: its checkpoint is written (it was dropped, so a run that
  skipped at every save boundary saved nothing). 'stop' refuses it in one line, parameters that are not
  finite are never saved."""
  from mlm_jax.errors import UserError
  from mlm_jax.training import loop as loop_lib
  from mlm_jax.workdir import checkpoints
  class NoInput:
    def get_state(self):
      return {}

  def loop_of(nonfinite):
    trainer = tiny_trainer(None, steps=4, batch_size=4, nonfinite=nonfinite)
    return loop_lib.Loop(trainer, str(tmp_path), NoInput(), None, trainer.init, tokens_per_example=16,
                         flops_per_token=1.0), trainer.init()

  run, state = loop_of("skip")
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  skipped = {"finite": np.float32(0.0)}
  run._save(ckpt, state, skipped, 2)
  ckpt.wait()
  assert ckpt.all_steps() == [2]
  bad = state.replace(params=jax.tree.map(lambda x: x * np.float32("nan"), state.params))
  run._save(ckpt, bad, {"finite": np.float32(1.0)}, 3)
  ckpt.wait()
  assert ckpt.all_steps() == [2]
  run, state = loop_of("stop")
  try:
    run._save(ckpt, state, skipped, 4)
  except UserError as e:
    assert "not finite at step 4" in str(e) and "intact" in str(e)
  else:
    raise AssertionError("nonfinite='stop' saved a skipped step")
  ckpt.close()
