"""Fine-tuning binary: python -m mlm_jax.finetune --config=configs/finetune/TASK.py --init_from=SRC --workdir=DIR

Pretrain once, fine-tune many times: SRC is a pretraining workdir (its latest checkpoint, config.json
and tokenizer), a `tools/convert_checkpoint.py from_hf` folder, or a transformers folder (converted
once into DIR/init_model by the same converter; resolve.py). A task head (mlm_jax/finetuning/heads.py) goes on
the encoder, and the labeled files of `config.task` (mlm_jax/tasks/) are tokenized with the model's
own tokenizer (sentencepiece, WordPiece or byte-level BPE).

Only what is specific to tasks lives here: the task's data and batches, its evaluation (decoded and
scored every `train.eval_every` steps: `eval_accuracy`, `eval_macro_f1`, `eval_f1`,
`eval_exact_match`, ...), the best checkpoint by `train.best_metric` (DIR/best/checkpoints), and at
the end the best parameters' predictions (DIR/predictions.*) and scores (DIR/eval_results.json).
Steps, logging, checkpoints for resuming, SIGTERM: the pretraining loop (loop.py).

Batches are a pure function of (seed, step): the training set is visited in a fresh permutation
per epoch, so a resumed run sees the same batches as an uninterrupted one.
"""
from __future__ import annotations

from mlm_jax import runtime

runtime.configure()   # before jax and tensorflow are imported: platform and log levels
if __name__ == "__main__":
  runtime.choose_allocator()   # on CPU: re-executes under mimalloc (mlm_jax/allocator.py)

import json  # noqa: E402
import os  # noqa: E402

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import ml_collections  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from mlm_jax.workdir import checkpoints as ckpt_lib  # noqa: E402
from mlm_jax.model import flops, sharding
from mlm_jax.finetuning import heads
from mlm_jax.training import loop as loop_lib, resolve, trainer as step_lib  # noqa: E402
from mlm_jax.workdir import files as workdir_lib  # noqa: E402
from mlm_jax.tasks import task as task_lib  # noqa: E402
from mlm_jax.tasks.features import pad_rows  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Fine-tuning config (configs/finetune/*.py), fields "
                                          "overridable as --config.train.steps=100.", lock_config=True)
_INIT_FROM = flags.DEFINE_string("init_from", None, "Pretraining workdir, from_hf folder or transformers folder "
                                 "(overrides config.init_from).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, predictions.")


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

  def __init__(self, trainer: step_lib.Trainer, task):
    self.trainer, self.task = trainer, task
    self.batch_size = trainer.config.train.eval_batch_size
    self.arrays = pad_rows(task.eval, self.batch_size)   # whole global batches
    self.rows = len(task.eval["weight"])
    self.best_name = trainer.config.train.best_metric or task_lib.DEFAULT_METRIC[task.kind]

  def predict(self, params) -> tuple[dict, object]:
    outs = []
    for b in range(0, len(self.arrays["weight"]), self.batch_size):
      local = _local_rows(self.arrays, np.arange(b, b + self.batch_size))
      out = self.trainer.eval_step(params, sharding.global_batch(local, self.trainer.batch_sharding), None)
      outs.append(jax.device_get(out))
    joined = jax.tree.map(lambda *xs: np.concatenate(xs)[:self.rows], *outs)
    scores, pred = self.task.score(joined)
    return {f"eval_{k}": float(v) for k, v in scores.items()}, pred

  def __call__(self, params, step: int) -> dict:
    return self.predict(params)[0]

  def finish(self, workdir: str, abstract_params) -> dict:
    """Scores and predictions of the best checkpoint on disk (even if the run died right after saving it)."""
    import tensorflow as tf   # for gs:// workdirs
    params, best_step = ckpt_lib.restore_params(os.path.join(workdir, "best"), abstract_params)
    ev, pred = self.predict(params)
    path = os.path.join(workdir, task_lib.PREDICTIONS_FILE[self.task.kind])
    result = dict(best_step=best_step, best_metric=self.best_name, predictions=path, **ev)
    if jax.process_index() == 0:
      self.task.write_predictions(pred, path)
      with tf.io.gfile.GFile(os.path.join(workdir, "eval_results.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    logging.info("best %s %.4f at step %d; predictions in %s", self.best_name, ev[f"eval_{self.best_name}"],
                 best_step, path)
    return result


def score_more(evaluator: TaskEvaluator, config, tok, workdir: str, abstract_params, extra_evals: dict) -> dict:
  """{name: scores} of the best checkpoint on more eval sets ({name: files}: a test split, other
  languages), each split as the task's own eval set (task.build_eval)."""
  params, _ = ckpt_lib.restore_params(os.path.join(workdir, "best"), abstract_params)
  out = {}
  for name, files in extra_evals.items():
    task = task_lib.build_eval(config.task, files, tok, config.seq_len, config.model.type_vocab_size,
                               evaluator.task.labels)
    out[name] = dict(TaskEvaluator(evaluator.trainer, task).predict(params)[0], examples=len(task.eval_examples))
  return out


def finetune(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None,
             extra_evals: dict | None = None) -> dict:
  """Runs (or resumes) fine-tuning; returns the scores of the best checkpoint (and under "extra" its
  scores on `extra_evals`, see score_more)."""
  tf = runtime.tensorflow()
  workdir = loop_lib.make_workdir(workdir)
  config, tok = resolve.resolve_finetuning(config, workdir, init_from)
  mcfg, kind = config.model, config.task.kind
  task = task_lib.build(config.task, tok, config.seq_len, mcfg.type_vocab_size)
  logging.info("task %s: %d training rows, %d eval examples (%d rows), labels %s", kind, len(task.train["weight"]),
               len(task.eval_examples), len(task.eval["weight"]), task.labels or "-")
  make_model = lambda: heads.TaskModel(mcfg, kind, task.num_labels, seed=config.seed, head_dropout=config.head_dropout)
  trainer = step_lib.make_trainer(config, sharding.make_mesh(config.mesh), objective=heads.TaskObjective(kind),
                                  make_model=make_model)
  abstract = ckpt_lib.abstract_with_shardings(jax.eval_shape(trainer.init), trainer.state_sharding)

  def init_state():
    state = trainer.init()
    if config.random_init:
      logging.info("random initialization (baseline): architecture and tokenizer of %s, no weights", config.init_from)
      return state
    params = state.params
    params["encoder"] = workdir_lib.restore_params_for(config.init_from, mcfg, abstract.params["encoder"])
    logging.info("encoder initialized from %s", config.init_from)
    return state.replace(params=params)

  if jax.process_index() == 0:
    with tf.io.gfile.GFile(os.path.join(workdir, "task.json"), "w") as f:
      json.dump(dict(kind=kind, labels=task.labels, model=mcfg.to_dict(), tokenizer=tok.model_path), f, indent=1)
  evaluator = TaskEvaluator(trainer, task)
  loop = loop_lib.Loop(trainer, workdir, TaskInput(task.train, config.train.batch_size, config.seed), evaluator,
                       init_state, tokens_per_example=config.seq_len,
                       flops_per_token=flops.flops_per_token(mcfg, config.seq_len, 0),
                       best_metric=f"eval_{evaluator.best_name}")
  loop.run()
  if loop.preempted:
    return {}
  result = evaluator.finish(workdir, abstract.params)
  if extra_evals:
    result["extra"] = score_more(evaluator, config, tok, workdir, abstract.params, extra_evals)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  runtime.start()
  finetune(_CONFIG.value, _WORKDIR.value, _INIT_FROM.value)


def run():
  """Console-script entry point (`mlm-jax-finetune`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
