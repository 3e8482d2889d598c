"""Fine-tuning a pretrained encoder on one labeled task, through the one loop (training/loop.py).

The task's batches (a pure function of seed and step, so resume is exact), its evaluator every
`train.eval_every` steps, the best checkpoint by `train.best_metric` (DIR/best), and at the end that
checkpoint's predictions (DIR/predictions.*) and scores (DIR/eval_results.json).
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
from absl import logging

from mlm_jax import paths, runtime
from mlm_jax.errors import Preempted
from mlm_jax.finetuning import heads
from mlm_jax.model import flops, sharding
from mlm_jax.tasks import task as task_lib
from mlm_jax.tasks.features import pad_rows
from mlm_jax.training import loop, provision, resolve, trainer as trainer_lib
from mlm_jax.workdir import files as workdir_files, lock, restore


class Batches:
  """Row indices of the global batch at any step: a fresh permutation of the training set per epoch."""

  def __init__(self, n: int, batch_size: int, seed: int):
    self.n, self.batch_size, self.seed = n, batch_size, seed
    self._epoch, self._perm = -1, None

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch != self._epoch:
      self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
    return self._perm

  def indices(self, step: int) -> np.ndarray:
    pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
    return np.asarray([self._permutation(int(p // self.n))[p % self.n] for p in pos])


def _local_rows(arrays: dict, rows: np.ndarray) -> dict:
  """This process's part of a global batch (processes hold consecutive row blocks)."""
  n, i = jax.process_count(), jax.process_index()
  per = len(rows) // n
  mine = rows[i * per:(i + 1) * per]
  return {k: v[mine] for k, v in arrays.items()}


class TaskInput:
  """The loop's Input: batches are a function of the step, so there is no position to save."""

  def __init__(self, arrays: dict, batch_size: int, seed: int):
    self.arrays, self.order = arrays, Batches(len(arrays["weight"]), batch_size, seed)

  def batch(self, step: int) -> dict:
    return _local_rows(self.arrays, self.order.indices(step))

  def get_state(self) -> dict:
    return {}

  def set_state(self, state: dict) -> None:
    pass


class TaskEvaluator:
  """Decode and score the eval set (the loop keeps the best parameters by `train.best_metric` in DIR/best)."""

  def __init__(self, trainer: trainer_lib.Trainer, task):
    self.trainer, self.task = trainer, task
    self.batch_size = trainer.config.train.eval_batch_size
    self.arrays = pad_rows(task.eval, self.batch_size)   # whole global batches
    self.rows = len(task.eval["weight"])
    self.best_name = trainer.config.train.best_metric or task.default_metric

  def predict(self, params) -> tuple[dict, object]:
    outs = []
    for b in range(0, len(self.arrays["weight"]), self.batch_size):
      local = _local_rows(self.arrays, np.arange(b, b + self.batch_size))
      out = self.trainer.eval_step(params, sharding.global_batch(local, self.trainer.batch_sharding), None,
                                   self.trainer.values)
      outs.append(jax.device_get(out))
    joined = jax.tree.map(lambda *xs: np.concatenate(xs)[:self.rows], *outs)
    scores, pred = self.task.score(joined)
    return {f"eval_{k}": float(v) for k, v in scores.items()}, pred

  def __call__(self, params, step: int) -> dict:
    return self.predict(params)[0]

  def finish(self, workdir: str, abstract_params) -> dict:
    """Scores and predictions of the best checkpoint on disk (even if the run died right after saving it)."""
    params, best_step = restore.restore_params(os.path.join(workdir, "best"), abstract_params)
    ev, pred = self.predict(params)
    path = os.path.join(workdir, task_lib.PREDICTIONS_FILE[self.task.kind])
    result = dict(best_step=best_step, best_metric=self.best_name, predictions=path, **ev)
    if jax.process_index() == 0:
      self.task.write_predictions(pred, path)
      with paths.open_file(os.path.join(workdir, "eval_results.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    logging.info("best %s %.4f at step %d; predictions in %s", self.best_name, ev[f"eval_{self.best_name}"],
                 best_step, path)
    return result


def score_more(evaluator: TaskEvaluator, config, tok, workdir: str, abstract_params, extra_evals: dict) -> dict:
  """{name: scores} of the best checkpoint on more eval sets ({name: files}: a test split, other
  languages), each split as the task's own eval set (task.build_eval)."""
  params, _ = restore.restore_params(os.path.join(workdir, "best"), abstract_params)
  out = {}
  for name, eval_files in extra_evals.items():
    task = task_lib.build_eval(config.task, eval_files, tok, config.seq_len, config.model.type_vocab_size,
                               evaluator.task.labels)
    out[name] = dict(TaskEvaluator(evaluator.trainer, task).predict(params)[0], examples=len(task.eval_examples))
  return out


def finetune(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None,
             extra_evals: dict | None = None) -> dict:
  """Runs (or resumes) fine-tuning; returns the scores of the best checkpoint (and under "extra" its
  scores on `extra_evals`, see score_more); raises errors.Preempted once SIGTERM has stopped and saved it."""
  runtime.tensorflow()
  workdir = workdir_files.make_workdir(workdir)
  with lock.held(workdir, config.train.get("lock_stale_hours", 72.0), jax.process_index()):
    return _finetune(config, workdir, init_from, extra_evals)


def _finetune(config: ml_collections.ConfigDict, workdir: str, init_from: str | None,
              extra_evals: dict | None) -> dict:
  provision.finetuning(config, workdir, init_from)
  run = resolve.resolve_finetuning(config, workdir, init_from)
  config, tok = run.config, run.tokenizer
  mcfg, kind = config.model, config.task.kind
  task = task_lib.build(config.task, tok, config.seq_len, mcfg.type_vocab_size)
  logging.info("task %s: %d training rows, %d eval examples (%d rows), labels %s", kind, len(task.train["weight"]),
               len(task.eval_examples), len(task.eval["weight"]), task.labels or "-")
  make_model = lambda: heads.TaskModel(mcfg, kind, task.num_labels, seed=config.seed, head_dropout=config.head_dropout)
  trainer = trainer_lib.make_trainer(config, sharding.make_mesh(config.mesh), step=heads.TaskObjective(kind),
                                     make_model=make_model)
  abstract = restore.abstract_with_shardings(jax.eval_shape(trainer.init), trainer.state_sharding)

  def init_state():
    state = trainer.init()
    if config.random_init:
      logging.info("random initialization (baseline): architecture and tokenizer of %s, no weights", config.init_from)
      return state
    params = state.params
    params["encoder"] = restore.restore_params_for(config.init_from, mcfg, abstract.params["encoder"])
    logging.info("encoder initialized from %s", config.init_from)
    return state.replace(params=params)

  if jax.process_index() == 0:
    with paths.open_file(os.path.join(workdir, "task.json"), "w") as f:
      json.dump(dict(kind=kind, labels=task.labels, model=mcfg.to_dict(), tokenizer=tok.model_path), f, indent=1)
  evaluator = TaskEvaluator(trainer, task)
  run_loop = loop.Loop(trainer, workdir, TaskInput(task.train, config.train.batch_size, config.seed), evaluator,
                       init_state, tokens_per_example=config.seq_len,
                       flops_per_token=flops.flops_per_token(mcfg, config.seq_len, 0),
                       best_metric=f"eval_{evaluator.best_name}", user_config=run.user)
  run_loop.run()
  if run_loop.preempted:
    raise Preempted(run_loop.stopped_at, jax.process_count())   # the binary exits 75, as train's does
  result = evaluator.finish(workdir, abstract.params)
  if extra_evals:
    result["extra"] = score_more(evaluator, config, tok, workdir, abstract.params, extra_evals)
  return result
