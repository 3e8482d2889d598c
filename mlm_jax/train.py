"""Pretraining binary: python -m mlm_jax.train --config=configs/demo.py --workdir=DIR

One readable loop (big_vision style): tokenizer -> pipeline -> sharded state (fresh, restored from
DIR, or initialized from `config.init_from`) -> jitted train step -> logs, evals, checkpoints.
Re-running the same command resumes from the latest checkpoint in DIR; SIGTERM (preemption)
saves at the next step boundary and exits 0.

No host sync on steps that do not log: metric sums stay on device and are fetched every
`train.log_every` steps.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import config_flags  # noqa: E402
import ml_collections  # noqa: E402

from mlm_jax import checkpoint as ckpt_lib  # noqa: E402
from mlm_jax import cli  # noqa: E402
from mlm_jax import flops, masking, objectives, sharding, step as step_lib  # noqa: E402
from mlm_jax.metrics_writer import MetricsWriter  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py), fields overridable "
                                          "as --config.train.steps=100.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, config.json.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for multi-process runs "
                                   "outside TPU VMs / SLURM (which are detected automatically).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Number of processes (with --coordinator_address).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index (with --coordinator_address).")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout_s", 60, "A process silent this long fails the job.")


class TrainError(RuntimeError):
  """A problem the user can fix; printed as one line, with no traceback."""


def _resolve_paths(config: ml_collections.ConfigDict, workdir: str) -> None:
  """`{workdir}` in data paths means the run's directory (the demo keeps its corpus there)."""
  d = config.data
  with config.unlocked():
    d.sources = tuple(s.replace("{workdir}", workdir) for s in d.sources)
    d.eval_sources = tuple(s.replace("{workdir}", workdir) for s in d.eval_sources)
    d.tokenizer = d.tokenizer.replace("{workdir}", workdir)


def _tokenizer(config: ml_collections.ConfigDict, workdir: str):
  """Load `data.tokenizer`, or train one into the workdir from the training sources (once)."""
  from mlm_jax.data import tokenizer as tok_lib
  path = config.data.tokenizer
  if not path:
    path = os.path.join(workdir, "tokenizer", "spm.model")
    if not os.path.exists(path) and jax.process_index() == 0:
      t = config.tokenizer
      logging.info("training a %d-piece %s tokenizer on %s", t.vocab_size, t.model_type, config.data.sources)
      tok_lib.train(list(config.data.sources), path[:-len(".model")], vocab_size=t.vocab_size, layout=t.layout,
                    model_type=t.model_type, alpha=t.alpha, input_sentence_size=t.input_sentence_size,
                    seed=config.seed, log=logging.info)
    sharding.sync_processes("tokenizer")
  elif not os.path.exists(path) and "://" not in path:
    raise TrainError(f"data.tokenizer={path!r}: no such file (expected a sentencepiece .model)")
  return tok_lib.load(path)


def _bind_tokenizer(config: ml_collections.ConfigDict, tok) -> None:
  """Model vocabulary and masking ids come from the tokenizer; a mismatch is an error."""
  with config.unlocked():
    if config.model.vocab_size <= 0:
      config.model.vocab_size = tok.vocab_size
    config.masking.mask_id = tok.mask_id
    config.masking.special_ids = tuple(int(i) for i in tok.special_ids if i != tok.mask_id)
  if config.model.vocab_size != tok.vocab_size:
    raise TrainError(f"model.vocab_size={config.model.vocab_size} does not match the tokenizer "
                     f"{tok.model_path} ({tok.vocab_size} pieces)")


class _RowSlice:
  """Every process reads the whole global batch and keeps its rows (data.per_host='slice')."""

  def __init__(self, pipeline, start: int, size: int):
    self.pipeline, self.start, self.size = pipeline, start, size

  def __iter__(self):
    return self

  def __next__(self):
    return {k: v[self.start:self.start + self.size] for k, v in next(self.pipeline).items()}

  def rewind(self):
    self.pipeline.rewind()

  def get_state(self):
    return self.pipeline.get_state()

  def set_state(self, state):
    self.pipeline.set_state(state)


def _host_pipeline(pipeline_lib, config, tok, split: str):
  """This process's rows of each global batch.

  per_host='shard' (default): each process reads its own disjoint part of the corpus (scales to any
  corpus and host count). per_host='slice': each process reads the whole stream and keeps its rows,
  so the global batches are identical for any process count (small corpora, reproducibility tests).
  """
  n, i = jax.process_count(), jax.process_index()
  local = config.train.batch_size // n
  mode = config.data.get("per_host", "shard")
  if mode == "slice":
    whole = pipeline_lib.Pipeline(config.data, tok, config.train.batch_size, seed=config.seed, split=split)
    return _RowSlice(whole, i * local, local)
  if mode != "shard":
    raise TrainError(f"data.per_host={mode!r}: expected 'shard' or 'slice'")
  return pipeline_lib.Pipeline(config.data, tok, local, seed=config.seed, process_index=i, process_count=n,
                               split=split)


def _peak_flops(config) -> float:
  """Peak FLOP/s of all devices: config override, known accelerator peaks, or measured on CPU."""
  if config.train.peak_tflops_per_device > 0:
    per = config.train.peak_tflops_per_device * 1e12
  else:
    kind = jax.devices()[0].device_kind.lower()
    known = {"v4": 275e12, "v5 lite": 197e12, "v5e": 197e12, "v5p": 459e12, "v5": 459e12, "v6": 918e12,
             "h100": 989e12, "h200": 989e12, "a100": 312e12}
    per = next((v for k, v in known.items() if k in kind), 0.0)
    if not per:
      per = flops.measure_matmul_peak(n=1024, repeats=3)
  return per * jax.device_count()


def _evaluate(trainer, params, eval_pipeline, num_batches, key, pad_id) -> dict:
  """Held-out metrics over `num_batches` global batches with fixed masks (comparable across evals).

  Every process runs exactly `num_batches` steps (collectives must line up); a process whose
  eval shard runs out feeds all-padding rows, which carry no predictions.
  """
  rows = trainer.config.train.batch_size // jax.process_count()
  shape = (rows, trainer.config.data.seq_len)
  filler = {k: np.full(shape, pad_id if k == "input_ids" else 0, np.int32)
            for k in ("input_ids", "segment_ids", "positions", "word_starts")}
  pipeline, sums = eval_pipeline(), None
  for _ in range(num_batches):
    batch = next(pipeline, filler)
    s = trainer.eval_step(params, sharding.global_batch(batch, trainer.batch_sharding), key)
    sums = s if sums is None else jax.tree.map(jnp.add, sums, s)
  pipeline.rewind()   # drops its reader, which would otherwise keep prefetching through training
  host = jax.device_get(sums) if sums is not None else None
  if host is None or host["num_predictions"] == 0:
    raise TrainError("the eval split produced no batch (check data.eval_sources / data.eval_percent)")
  return {f"eval_{k}": float(v) for k, v in objectives.summarize(host).items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) training; returns the last logged metrics."""
  from mlm_jax.data import pipeline as pipeline_lib
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")

  workdir = workdir if "://" in workdir else os.path.abspath(workdir)
  tf.io.gfile.makedirs(workdir)
  _resolve_paths(config, workdir)
  if config.demo_corpus:
    from mlm_jax import demo_corpus
    if jax.process_index() == 0:
      demo_corpus.write(os.path.join(workdir, "demo_corpus"))
    sharding.sync_processes("demo_corpus")
  tok = _tokenizer(config, workdir)
  _bind_tokenizer(config, tok)

  mesh = sharding.make_mesh(config.mesh)
  trainer = step_lib.make_trainer(config, mesh)
  t = config.train
  n_proc = jax.process_count()
  if t.batch_size % n_proc:
    raise TrainError(f"train.batch_size={t.batch_size} is not divisible by the {n_proc} processes")
  pipeline = _host_pipeline(pipeline_lib, config, tok, "train")
  # Built at the first evaluation (~1 s of tf.data tracing), then reused.
  eval_pipeline = functools.cache(lambda: _host_pipeline(pipeline_lib, config, tok, "eval"))

  checkpointer = ckpt_lib.Checkpointer(workdir, keep=t.keep_checkpoints)
  abstract = ckpt_lib.abstract_with_shardings(jax.eval_shape(trainer.init), trainer.state_sharding)
  latest = checkpointer.latest_step()
  if latest is not None:
    state, data_state = checkpointer.restore(latest, abstract)
    pipeline.set_state(data_state)
    logging.info("resuming from step %d", latest)
  elif config.init_from:
    state = trainer.init()
    state = state.replace(params=ckpt_lib.load_params(config.init_from, abstract.params))
    logging.info("initialized parameters from %s", config.init_from)
  else:
    state = trainer.init()
  start = int(jax.device_get(state.step))

  writer = MetricsWriter(workdir, enabled=jax.process_index() == 0, truncate_after=start)
  if jax.process_index() == 0:
    with tf.io.gfile.GFile(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))

  preempted = []
  signal.signal(signal.SIGTERM, lambda *_: preempted.append(True))

  seq_len = config.data.seq_len
  fpt = flops.flops_per_token(config.model, seq_len, masking.max_predictions(config.masking, seq_len))
  peak = _peak_flops(config)
  key = jax.random.key(config.seed)
  eval_key = jax.random.fold_in(jax.random.key(config.seed), 2**31 - 1)
  logging.info("training steps %d..%d, global batch %d x %d tokens, mesh %s, %.1fM parameters",
               start, t.steps, t.batch_size, seq_len, dict(mesh.shape),
               sum(x.size for x in jax.tree.leaves(state.params)) / 1e6)

  last = {}
  if t.eval_at_start and start == 0:
    ev = _evaluate(trainer, state.params, eval_pipeline, t.eval_batches, eval_key, tok.pad_id)
    writer.write(dict(step=0, **ev))
    logging.info("step 0  eval loss %.4f  acc %.3f  ppl %.2f", ev["eval_loss"], ev["eval_accuracy"],
                 ev["eval_perplexity"])
  sums, since, t_last = None, 0, time.perf_counter()
  t_start, bad_in_a_row = t_last, 0
  step = start
  while step < t.steps:
    batch = sharding.global_batch(next(pipeline), trainer.batch_sharding)
    state, m = trainer.train_step(state, batch, key)
    sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
    step += 1
    since += 1
    final = step == t.steps or bool(preempted)

    if step % t.log_every == 0 or final:
      host = jax.device_get(sums)
      now = time.perf_counter()
      tokens_per_sec = since * t.batch_size * seq_len / (now - t_last)
      rates = objectives.summarize(host)
      last = dict(step=step, loss=float(rates["loss"]), accuracy=float(rates["accuracy"]),
                  learning_rate=float(host["learning_rate"]) / since, grad_norm=float(host["grad_norm"]) / since,
                  tokens_per_sec=tokens_per_sec, mfu=tokens_per_sec * fpt / peak,
                  skipped_nonfinite=int(since - host["finite"]))
      eta = (t.steps - step) * (now - t_start) / max(step - start, 1)
      writer.write(last)
      logging.info("step %d/%d  loss %.4f  acc %.3f  lr %.2e  %.0f tok/s  MFU %.1f%%  ETA %s", step, t.steps,
                   last["loss"], last["accuracy"], last["learning_rate"], tokens_per_sec, 100 * last["mfu"],
                   time.strftime("%H:%M:%S", time.gmtime(eta)))
      if last["skipped_nonfinite"] and t.nonfinite == "stop":
        raise TrainError(f"non-finite loss or gradient at step <= {step} (train.nonfinite='stop'); the last "
                         "checkpoint is intact. Lower optimizer.learning_rate or set train.nonfinite='skip'")
      # Skipped steps in a row (as far as log intervals tell): a run that only skips has diverged.
      bad_in_a_row = bad_in_a_row + since if last["skipped_nonfinite"] == since else last["skipped_nonfinite"]
      if bad_in_a_row >= t.max_consecutive_nonfinite:
        raise TrainError(f"{bad_in_a_row} consecutive non-finite steps up to step {step}: training diverged; "
                         "the last checkpoint is intact. Lower optimizer.learning_rate")
      sums, since, t_last = None, 0, time.perf_counter()

    if step % t.eval_every == 0 or step == t.steps:
      ev = _evaluate(trainer, state.params, eval_pipeline, t.eval_batches, eval_key, tok.pad_id)
      writer.write(dict(step=step, **ev))
      logging.info("step %d  eval loss %.4f  acc %.3f  ppl %.2f", step, ev["eval_loss"], ev["eval_accuracy"],
                   ev["eval_perplexity"])
      last.update(ev)
      t_last = time.perf_counter()   # evaluation time is not training throughput

    if step % t.save_every == 0 or step == t.steps or preempted:   # SIGTERM may have come during eval
      if float(jax.device_get(m["finite"])) and ckpt_lib.all_finite(state.params):
        checkpointer.save(step, state, pipeline.get_state())
      elif t.nonfinite == "stop":
        raise TrainError(f"the loss or parameters are not finite at step {step}: refusing to write a "
                         "checkpoint; the last checkpoint is intact. Lower optimizer.learning_rate")
      else:
        logging.warning("step %d: loss or parameters not finite, checkpoint not written", step)
    if preempted:
      logging.info("SIGTERM: saved step %d, exiting", step)
      break

  checkpointer.close()
  writer.close()
  return last


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _HEARTBEAT.value)
  cli.keep_freed_memory()   # before setup_logging: that starts the backend
  cli.setup_logging()
  try:
    train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (TrainError, ckpt_lib.CheckpointError, ValueError, FileNotFoundError) as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


def run():
  """Console-script entry point (`mlm-jax-train`)."""
  cli.run(main)


if __name__ == "__main__":
  run()
