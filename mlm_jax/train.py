"""Pretraining binary: python -m mlm_jax.train --config=configs/demo.py --workdir=DIR

Resolve the config (tokenizer, vocabulary, checks; resolve.py) -> input pipeline (packed rows or
sentence pairs, as the objective asks) -> trainer (the objective named by config.objective and the
model it makes; objectives/, step.py) -> the one loop (loop.py): logs, evals, checkpoints with
the input's position. Re-running the same command resumes from the latest checkpoint in DIR;
SIGTERM (preemption) saves at the next step boundary and exits 0. `config.init_from` starts the
parameters from another workdir or a `convert_checkpoint.py from_hf` folder.
"""
from __future__ import annotations

from mlm_jax import runtime

runtime.configure()   # before jax and tensorflow are imported: platform and log levels
if __name__ == "__main__":
  runtime.choose_allocator()   # on CPU: re-executes under mimalloc (mlm_jax/allocator.py)


from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import config_flags  # noqa: E402
import ml_collections  # noqa: E402

from mlm_jax.workdir import checkpoints as ckpt_lib  # noqa: E402
from mlm_jax.model import flops, sharding
from mlm_jax.training import loop as loop_lib, resolve, trainer as step_lib
from mlm_jax.objectives import masking  # noqa: E402
from mlm_jax.evaluation import probe as probe_lib  # noqa: E402
from mlm_jax.workdir import files as workdir_lib  # noqa: E402
from mlm_jax.objectives import registry  # noqa: E402
from mlm_jax.errors import DataError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py), fields overridable "
                                          "as --config.train.steps=100.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, config.json.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for multi-process runs "
                                   "outside TPU VMs / SLURM (which are detected automatically).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Number of processes (with --coordinator_address).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index (with --coordinator_address).")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout_s", 60, "A process silent this long fails the job.")


def host_pipeline(config: ml_collections.ConfigDict, tok, split: str, workdir: str):
  """This process's rows of each global batch (data/input.py); a token store's packing index is
  cached in WORKDIR/data_index (a local folder when the workdir is gs://)."""
  from mlm_jax.data import inputs as data_input
  from mlm_jax.data.store import index as store_index
  kind = registry.for_config(config).input_kind   # packed rows or sentence pairs: the objective's
  return data_input.make_input(config, kind, tok, split, process_index=jax.process_index(),
                               process_count=jax.process_count(), cache_dir=store_index.cache_dir_for(workdir))


class PipelineInput:
  """A pipeline as the loop's Input: the stream is sequential, so `step` only names the batch."""

  def __init__(self, pipeline):
    self.pipeline = pipeline

  def batch(self, step: int) -> dict:
    return next(self.pipeline)

  def metrics(self) -> dict:
    """A token store's per-source epochs, tokens and current weight (global), its mixing phase and
    alpha under a curriculum, and a pair stream's counts, for the log line."""
    stats = self.pipeline.stats() if hasattr(self.pipeline, "stats") else {}
    out = {f"data/{name}/{k}": float(s[k]) for name, s in stats.get("sources", {}).items()
           for k in ("epochs", "tokens", "weight") if k in s}
    out.update({f"data/{k}": float(v) for k, v in stats.items() if k in ("mix_alpha", "phase")})
    out.update({f"data/{k}": float(v) for k, v in stats.get("pairs", {}).items()})
    return out

  def get_state(self) -> dict:
    return self.pipeline.get_state()

  def set_state(self, state: dict) -> None:
    self.pipeline.set_state(state)


class HeldOut:
  """Held-out MLM metrics over `train.eval_batches` global batches with fixed masks (comparable across evals).

  Every process runs exactly that many steps (collectives must line up); a process whose eval shard
  runs out feeds all-padding rows, which carry no predictions. The pipeline is built before training
  (~1 s of tf.data tracing), so a missing or empty eval split fails at start, not after the run has
  trained; it is read only when evaluating, and rewound after each evaluation.
  """

  def __init__(self, trainer: step_lib.Trainer, tok, workdir: str):
    self.trainer, self.tok = trainer, tok
    self.pipeline = host_pipeline(trainer.config, tok, "eval", workdir)
    self.key = jax.random.fold_in(jax.random.key(trainer.config.seed), 2**31 - 1)

  def __call__(self, params, step: int) -> dict:
    config = self.trainer.config
    rows = config.train.batch_size // jax.process_count()
    filler = {k: np.full((rows, *shape), self.tok.pad_id if k == "input_ids" else 0, np.int32)   # no loss
              for k, shape in self.trainer.objective.batch_features(config.data.seq_len).items()}
    pipeline, sums = self.pipeline, None
    for _ in range(config.train.eval_batches):
      batch = sharding.global_batch(next(pipeline, filler), self.trainer.batch_sharding)
      s = self.trainer.eval_step(params, batch, self.key)
      sums = s if sums is None else jax.tree.map(jnp.add, sums, s)
    pipeline.rewind()   # drops its reader, which would otherwise keep prefetching through training
    host = jax.device_get(sums) if sums is not None else None
    objective = self.trainer.objective
    if host is None or host[objective.count_key] == 0:
      raise DataError("the eval split produced no batch (check data.eval_sources / data.eval_percent)")
    rates = getattr(objective, "summarize_eval", objective.summarize)(host)
    return {f"eval_{k}": float(v) for k, v in rates.items()}


class Probe:
  """The loop's probe (mlm_jax/evaluation/probe.py): the objective's encoder run without dropout on fixed samples
  of `train.probe_tasks`, replicated on every device (a probe batch is small), linear classifiers
  fit on the host. Its task samples are read at start, so a bad task name fails before training."""

  ROWS = 64   # a probe forward pass's batch: one compiled shape for every probe

  def __init__(self, trainer: step_lib.Trainer, tok):
    from flax import nnx
    config = trainer.config
    path, model_cfg = trainer.objective.encoder(config)
    t = config.train
    self.probes = probe_lib.Probes(probe_lib.from_suite(
        t.probe_tasks, tok, config.data.seq_len, model_cfg.type_vocab_size, t.probe_train_examples,
        t.probe_eval_examples), self.ROWS)
    self.replicated = sharding.replicated(trainer.mesh)

    def hidden(params, batch):
      model = nnx.merge(trainer.graphdef, params)
      encoder = getattr(model, path) if path else model
      return encoder(batch["input_ids"], batch["segment_ids"], batch["positions"], batch["token_type_ids"])

    self.hidden = jax.jit(hidden, out_shardings=self.replicated)

  def __call__(self, params, step: int) -> dict:
    def last_layer(batch):
      keys = ("input_ids", "segment_ids", "positions", "token_type_ids")
      placed = {k: jax.make_array_from_process_local_data(self.replicated, batch[k]) for k in keys}
      return np.asarray(self.hidden(params, placed).addressable_data(0))
    return self.probes(last_layer)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None) -> dict:
  """Runs (or resumes) training; returns the last logged metrics. `overrides`: the command line's
  `--config.*` values, which must agree with an `init_from` source (resolve.bind_init_from)."""
  runtime.tensorflow()
  workdir = loop_lib.make_workdir(workdir)
  config, tok = resolve.resolve_pretraining(config, workdir, overrides)
  trainer = step_lib.make_trainer(config, sharding.make_mesh(config.mesh))

  def init_state():
    state = trainer.init()
    if config.init_from:
      abstract = ckpt_lib.abstract_with_shardings(jax.eval_shape(trainer.init), trainer.state_sharding)
      params = workdir_lib.restore_params_for(config.init_from, config.model, abstract.params, fresh=state.params)
      state = state.replace(params=params)
      logging.info("initialized parameters from %s", config.init_from)
    return state

  seq_len = config.data.seq_len
  fpt = flops.training_flops_per_token(config, seq_len, masking.max_predictions(config.masking, seq_len))
  probe = Probe(trainer, tok) if config.train.probe_every > 0 else None
  loop = loop_lib.Loop(trainer, workdir, PipelineInput(host_pipeline(config, tok, "train", workdir)),
                       HeldOut(trainer, tok, workdir),
                       init_state, tokens_per_example=seq_len, flops_per_token=fpt, probe=probe)
  return loop.run()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  runtime.start(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                process_id=_PROCESS_ID.value, heartbeat_timeout_s=_HEARTBEAT.value)
  train_and_evaluate(_CONFIG.value, _WORKDIR.value, config_flags.get_override_values(flags.FLAGS["config"]))


def run():
  """Console-script entry point (`mlm-jax-train`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
