"""Pretraining binary: python -m mlm_jax.train --config=configs/demo.py --workdir=DIR

Flags -> provision (demo corpus, tokenizer, transformers import) -> resolve (config, tokenizer,
objective) -> build (trainer, input, evaluator, probe) -> the one loop. Re-running the same command
resumes from the latest checkpoint in DIR; SIGTERM (preemption, on any host) saves one step agreed by
every host and exits 75 (training/preemption.py).
"""
from __future__ import annotations

import jax
from absl import app, flags
from ml_collections import config_flags
import ml_collections

from mlm_jax import runtime
from mlm_jax.data import inputs
from mlm_jax.errors import Preempted
from mlm_jax.evaluation import heldout, probe
from mlm_jax.model import sharding
from mlm_jax.training import loop, phase_runner, provision, resolve, trainer as trainer_lib
from mlm_jax.workdir import files as workdir_files, lock

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py), fields overridable "
                                          "as --config.train.steps=100.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory: checkpoints, metrics, config.json.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0, for multi-process runs "
                                   "outside TPU VMs / SLURM (which are detected automatically).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Number of processes (with --coordinator_address).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index (with --coordinator_address).")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout_s", 60, "A process silent this long fails the job.")


def host_input(run: resolve.Resolved, split: str, workdir: str, config=None, rows_before: int = 0):
  """This process's rows of each global batch of `split`, of the input the objective needs (of `config`,
  a phase's input config, when given, after the `rows_before` its earlier phases read)."""
  return inputs.make_input(config or run.config, run.objective.input_kind, run.tokenizer, split,
                           process_index=jax.process_index(), process_count=jax.process_count(), workdir=workdir,
                           rows_before=rows_before)


def held_out(run: resolve.Resolved, trainer, workdir: str, config=None) -> heldout.HeldOut:
  """The held-out evaluator of the eval split and, with train.eval_per_source, of each of its sources alone."""
  make = lambda c: host_input(run, "eval", workdir, c)
  parts = heldout.by_source(config or run.config, make)   # with them the whole split is never read: not built
  return heldout.HeldOut(trainer, run.tokenizer, None if parts else make(config), parts)


def _phased_loop(run: resolve.Resolved, workdir: str) -> loop.Loop:
  """The loop of a run in phases: each phase's trainer, input and evaluators are made as it begins."""

  def make_io(config, input_config, trainer, rows_before):
    return (inputs.LoopInput(host_input(run, "train", workdir, input_config, rows_before)),
            held_out(run, trainer, workdir, input_config),
            probe.Probe(trainer, run.tokenizer) if config.train.probe_every > 0 else None)

  stages = phase_runner.PhaseSet(list(run.phases), list(run.phase_configs), sharding.make_mesh(run.config.mesh),
                                 run.objective, make_io)
  first = stages.trainer(0)
  return loop.Loop(first, workdir, None, None, trainer_lib.fresh_or_init_from(first), tokens_per_example=0,
                   flops_per_token=0.0, phases=stages, user_config=run.user)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None) -> dict:
  """Runs (or resumes) training; returns the last logged metrics. `overrides`: the command line's
  `--config.*` values, which must agree with an `init_from` source (resolve.bind_init_from)."""
  runtime.tensorflow()
  workdir = workdir_files.make_workdir(workdir)
  with lock.held(workdir, config.train.get("lock_stale_hours", 72.0), jax.process_index()):
    return _train(config, workdir, overrides)


def _train(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None) -> dict:
  provision.pretraining(config, workdir, overrides)
  run = resolve.resolve_pretraining(config, workdir, overrides)
  if run.phases:
    the_loop = _phased_loop(run, workdir)
  else:
    config = run.config
    trainer = trainer_lib.make_trainer(config, sharding.make_mesh(config.mesh), run.objective)
    seq_len = config.data.seq_len
    the_loop = loop.Loop(
        trainer, workdir, inputs.LoopInput(host_input(run, "train", workdir)),
        held_out(run, trainer, workdir),
        trainer_lib.fresh_or_init_from(trainer), tokens_per_example=seq_len,
        flops_per_token=run.objective.flops_per_token(config, seq_len, config.masking.max_predictions),
        probe=probe.Probe(trainer, run.tokenizer) if config.train.probe_every > 0 else None, user_config=run.user)
  last = the_loop.run()
  if the_loop.preempted:
    raise Preempted(the_loop.stopped_at, jax.process_count())
  return last


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  runtime.start(cpu_devices=_CONFIG.value.get("cpu_devices", 0), coordinator_address=_COORDINATOR.value,
                num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value, heartbeat_timeout_s=_HEARTBEAT.value)
  train_and_evaluate(_CONFIG.value, _WORKDIR.value, config_flags.get_override_values(flags.FLAGS["config"]))


def run():
  """Console-script entry point (`mlm-jax-train`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
