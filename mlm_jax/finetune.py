"""Fine-tuning binary: python -m mlm_jax.finetune --config=configs/finetune/TASK.py --init_from=SRC --workdir=DIR

Pretrain once, fine-tune many times: SRC is a pretraining workdir (its latest checkpoint, config.json
and tokenizer), a `tools/convert_checkpoint.py from_hf` folder, or a transformers folder (converted
once into DIR/init_model by the same converter). A task head (mlm_jax/heads.py) goes on the
encoder, and the labeled files of `config.task` (mlm_jax/tasks/) are tokenized with the model's own
sentencepiece model.

One loop, with the pretraining machinery: the same mesh and logical-axis sharding, AdamW with
warmup and decay (optim.py), TrainState, orbax checkpoints (DIR/checkpoints, for resuming: re-run
the same command; SIGTERM saves and exits 0), metrics.jsonl + TensorBoard. Every
`train.eval_every` steps the eval set is decoded and scored (`eval_accuracy`, `eval_macro_f1`,
`eval_f1`, `eval_exact_match`, ...); the best checkpoint by `train.best_metric` is kept in
DIR/best/checkpoints. At the end the best parameters predict the eval set into DIR/predictions.*
and DIR/eval_results.json holds their scores.

Batches are a pure function of (seed, step): the training set is visited in a fresh permutation
per epoch, so a resumed run sees the same batches as an uninterrupted one.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from ml_collections import config_flags  # noqa: E402
import ml_collections  # noqa: E402

from mlm_jax import checkpoint as ckpt_lib  # noqa: E402
from mlm_jax import cli, heads, optim, sharding  # noqa: E402
from mlm_jax.metrics_writer import MetricsWriter  # noqa: E402
from mlm_jax import step as step_lib  # noqa: E402
from mlm_jax.step import TrainState  # noqa: E402
from mlm_jax.tasks import task as task_lib  # noqa: E402
from mlm_jax.tasks.readers import DataError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Fine-tuning config (configs/finetune/*.py), fields "
                                          "overridable as --config.train.steps=100.", lock_config=True)
_INIT_FROM = flags.DEFINE_string("init_from", None, "Pretraining workdir, from_hf folder or transformers folder "
                                 "(overrides config.init_from).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, predictions.")


class FinetuneError(RuntimeError):
  """A problem the user can fix; printed as one line, with no traceback."""


# ------------------------------------------------------------------------------------------
# The pretrained model: config, tokenizer, parameters
# ------------------------------------------------------------------------------------------
def resolve_source(init_from: str, workdir: str) -> tuple[str, ml_collections.ConfigDict]:
  """(folder holding config.json + checkpoints, its config); a transformers folder is converted first."""
  from mlm_jax.convert import checkpoint_io as cio
  if not init_from:
    raise FinetuneError("--init_from is required: a pretraining workdir, a from_hf folder or a transformers folder")
  path = os.path.join(init_from, "config.json")
  if not os.path.exists(path):
    raise FinetuneError(f"init_from={init_from!r}: no config.json (expected a pretraining workdir, a from_hf "
                        "folder or a transformers model folder)")
  with open(path, encoding="utf-8") as f:
    raw = json.load(f)
  if "model_type" in raw:   # a transformers folder: convert it once, with the converter
    out = os.path.join(workdir, "init_model")
    if not os.path.exists(os.path.join(out, "config.json")):
      if jax.process_index() == 0:
        summary = cio.from_hf(init_from, out, overwrite=True)
        logging.info("converted %s (%s) into %s", init_from, summary["arch"], out)
      sharding.sync_processes("from_hf")
    init_from = out
  return init_from, cio.read_config(init_from)


def model_config(source_cfg: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The source's model config (on top of today's defaults), with the fine-tuning dropout overrides."""
  from mlm_jax.defaults import default_config
  mcfg = default_config().model
  mcfg.update(source_cfg.model.to_dict())
  if config.hidden_dropout >= 0:
    mcfg.hidden_dropout = config.hidden_dropout
  if config.attention_dropout >= 0:
    mcfg.attention_dropout = config.attention_dropout
  return mcfg


def load_tokenizer(config, source: str, source_cfg, vocab_size: int):
  from mlm_jax.convert import checkpoint_io as cio
  path = config.tokenizer or cio.tokenizer_path(source, source_cfg)
  if not os.path.exists(path) and "://" not in path:
    raise FinetuneError(f"{source}: no sentencepiece tokenizer at {path}; pass --config.tokenizer=MODEL "
                        "(a transformers folder needs its spm.model or sentencepiece.bpe.model)")
  return cio.load_tokenizer(path, vocab_size)


# ------------------------------------------------------------------------------------------
# Data order
# ------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------
def finetune(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None) -> dict:
  """Runs (or resumes) fine-tuning; returns the scores of the best checkpoint."""
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")
  workdir = workdir if "://" in workdir else os.path.abspath(workdir)
  tf.io.gfile.makedirs(workdir)

  source, source_cfg = resolve_source(init_from or config.init_from, workdir)
  mcfg = model_config(source_cfg, config)
  tok = load_tokenizer(config, source, source_cfg, mcfg.vocab_size)
  limit = mcfg.max_position_embeddings - mcfg.position_offset
  if mcfg.positions == "learned" and config.seq_len > limit:
    raise FinetuneError(f"seq_len={config.seq_len}: the model has positions for {limit} tokens")
  kind, t = config.task.kind, config.train
  task = task_lib.build(config.task, tok, config.seq_len, mcfg.type_vocab_size)
  best_name = t.best_metric or task_lib.DEFAULT_METRIC[kind]
  n_proc = jax.process_count()
  for name, size in (("batch_size", t.batch_size), ("eval_batch_size", t.eval_batch_size)):
    if size % n_proc:
      raise FinetuneError(f"train.{name}={size} is not divisible by the {n_proc} processes")
  logging.info("task %s: %d training rows, %d eval examples (%d rows), labels %s", kind, len(task.train["weight"]),
               len(task.eval_examples), len(task.eval["weight"]), task.labels or "-")

  # Model, optimizer, shardings: as in pretraining (step.make_trainer), with a head on the encoder.
  mesh = sharding.make_mesh(config.mesh)
  make_model = lambda: heads.TaskModel(mcfg, kind, task.num_labels, seed=config.seed,
                                       head_dropout=config.head_dropout)
  graphdef, _ = nnx.split(nnx.eval_shape(make_model), nnx.Param)
  ocfg = ml_collections.ConfigDict(config.optimizer.to_dict())
  if not ocfg.warmup_steps:
    ocfg.warmup_steps = int(round(ocfg.get("warmup_fraction", 0.0) * t.steps))
  tx = optim.make_optimizer(ocfg, t.steps)
  schedule = optim.make_schedule(ocfg, t.steps)

  def init_fn():
    params = nnx.state(make_model(), nnx.Param)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      nonfinite=jnp.zeros((), jnp.int32))

  abstract_state = jax.eval_shape(init_fn)
  state_sh = sharding.state_shardings(abstract_state, mesh, config.sharding.rules)
  batch_sh, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)

  def train_step(state, batch, key):
    def loss_fn(params):
      model = nnx.merge(graphdef, params)
      outputs = model(batch, dropout_key=jax.random.fold_in(key, state.step))
      loss_sum, count = heads.loss_sums(kind, outputs, batch)
      return loss_sum / jnp.maximum(count, 1.0), loss_sum
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
    new_state = step_lib.apply_if_finite(state, grads, tx, finite, sharding.platform(mesh))
    return new_state, dict(loss=loss, learning_rate=schedule(state.step), finite=finite.astype(jnp.float32))

  def predict(params, batch):
    return nnx.merge(graphdef, params)(batch)

  init = jax.jit(init_fn, out_shardings=state_sh)
  train_jit = jax.jit(train_step, donate_argnums=(0,), in_shardings=(state_sh, batch_sh, repl),
                      out_shardings=(state_sh, repl))
  predict_jit = jax.jit(predict, in_shardings=(state_sh.params, batch_sh), out_shardings=repl)
  abstract = ckpt_lib.abstract_with_shardings(abstract_state, state_sh)

  checkpointer = ckpt_lib.Checkpointer(workdir, keep=t.keep_checkpoints)
  best_ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "best"), keep=1)
  latest = checkpointer.latest_step()
  progress = dict(best=None, best_step=None)
  if latest is not None:
    state, progress = checkpointer.restore(latest, abstract)
    logging.info("resuming from step %d", latest)
  else:
    state = init()
    if config.random_init:
      logging.info("random initialization (baseline): architecture and tokenizer of %s, no weights", source)
    else:
      params = state.params
      params["encoder"] = ckpt_lib.load_params(source, abstract.params["encoder"])
      state = state.replace(params=params)
      logging.info("encoder initialized from %s", source)
  start = int(jax.device_get(state.step))

  writer = MetricsWriter(workdir, enabled=jax.process_index() == 0, truncate_after=start)
  if jax.process_index() == 0:
    saved = ml_collections.ConfigDict(config.to_dict())
    saved.init_from = source
    with tf.io.gfile.GFile(os.path.join(workdir, "config.json"), "w") as f:
      f.write(saved.to_json_best_effort(indent=2, sort_keys=True))
    with tf.io.gfile.GFile(os.path.join(workdir, "task.json"), "w") as f:
      json.dump(dict(kind=kind, labels=task.labels, model=mcfg.to_dict(), tokenizer=tok.model_path), f, indent=1)

  eval_arrays = task.eval   # padded to whole global batches of eval_batch_size
  from mlm_jax.tasks.features import pad_rows
  eval_arrays = pad_rows(eval_arrays, t.eval_batch_size)
  n_eval_rows = len(task.eval["weight"])

  def evaluate(params) -> tuple[dict, object]:
    outs = []
    for b in range(0, len(eval_arrays["weight"]), t.eval_batch_size):
      rows = np.arange(b, b + t.eval_batch_size)
      out = predict_jit(params, sharding.global_batch(_local_rows(eval_arrays, rows), batch_sh))
      outs.append(jax.device_get(out))
    joined = jax.tree.map(lambda *xs: np.concatenate(xs)[:n_eval_rows], *outs)
    scores, pred = task.score(joined)
    return {f"eval_{k}": float(v) for k, v in scores.items()}, pred

  preempted = []
  signal.signal(signal.SIGTERM, lambda *_: preempted.append(True))
  batches = Batches(len(task.train["weight"]), t.batch_size, config.seed)
  key = jax.random.key(config.seed)
  logging.info("fine-tuning steps %d..%d, global batch %d x %d tokens, mesh %s, %.2fM parameters", start, t.steps,
               t.batch_size, config.seq_len, dict(mesh.shape), sum(x.size for x in jax.tree.leaves(state.params)) / 1e6)
  sums, since, t_last = None, 0, time.perf_counter()
  step = start
  while step < t.steps:
    local = _local_rows(task.train, batches.indices(step))
    state, m = train_jit(state, sharding.global_batch(local, batch_sh), key)
    sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
    step += 1
    since += 1
    final = step == t.steps or bool(preempted)
    if step % t.log_every == 0 or final:
      host = jax.device_get(sums)
      now = time.perf_counter()
      line = dict(step=step, loss=float(host["loss"]) / since, learning_rate=float(host["learning_rate"]) / since,
                  examples_per_sec=since * t.batch_size / (now - t_last),
                  skipped_nonfinite=int(round(since - float(host["finite"]))))
      writer.write(line)
      logging.info("step %d/%d  loss %.4f  lr %.2e  %.1f examples/s", step, t.steps, line["loss"],
                   line["learning_rate"], line["examples_per_sec"])
      sums, since, t_last = None, 0, time.perf_counter()
    if (step % t.eval_every == 0 or step == t.steps) and not preempted:
      ev, _ = evaluate(state.params)
      writer.write(dict(step=step, **ev))
      logging.info("step %d  %s", step, "  ".join(f"{k} {v:.4f}" for k, v in sorted(ev.items())))
      value = ev.get(f"eval_{best_name}")
      if value is None:
        raise FinetuneError(f"train.best_metric={best_name!r} is not an eval metric of this task: "
                            f"{', '.join(k[5:] for k in ev)}")
      if progress["best"] is None or value > progress["best"]:
        progress = dict(best=value, best_step=step)
        best_ckpt.save(step, {"params": state.params}, progress)
      t_last = time.perf_counter()
    if step % t.save_every == 0 or final:
      checkpointer.save(step, state, progress)
    if preempted:
      logging.info("SIGTERM: saved step %d, exiting", step)
      break

  checkpointer.close()
  best_ckpt.wait()
  result = {}
  best_step = best_ckpt.latest_step()   # what is on disk, even if the run died right after saving it
  if not preempted and best_step is not None:
    restored, _ = best_ckpt.restore(best_step, {"params": abstract.params})
    ev, pred = evaluate(restored["params"])
    path = os.path.join(workdir, task_lib.PREDICTIONS_FILE[kind])
    result = dict(best_step=best_step, best_metric=best_name, predictions=path, **ev)
    if jax.process_index() == 0:
      task.write_predictions(pred, path)
      with tf.io.gfile.GFile(os.path.join(workdir, "eval_results.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    logging.info("best %s %.4f at step %d; predictions in %s", best_name, ev[f"eval_{best_name}"], best_step,
                 path)
  best_ckpt.close()
  writer.close()
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  sharding.initialize_distributed()
  cli.keep_freed_memory()   # before setup_logging: that starts the backend
  cli.setup_logging()
  from mlm_jax.convert.checkpoint_io import ConversionError
  try:
    finetune(_CONFIG.value, _WORKDIR.value, _INIT_FROM.value)
  except (FinetuneError, DataError, ConversionError, ckpt_lib.CheckpointError, ValueError, FileNotFoundError) as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


def run():
  """Console-script entry point (`mlm-jax-finetune`)."""
  cli.run(main)


if __name__ == "__main__":
  run()
