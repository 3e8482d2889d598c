"""An objective defined outside the package, in this file, trains through make_trainer and the one loop
(mlm_jax/training/loop.py) with no package file edited: `config.objective = "module:Class"` names it, config.json
keeps that string, and a resumed run (and anything that reads the workdir) finds the class again."""
import json

import jax
import jax.numpy as jnp
import numpy as np

from mlm_jax.training import loop, resolve, trainer as trainer_lib
from mlm_jax.model import sharding
from mlm_jax.workdir import files as workdir_files
from mlm_jax.config.defaults import default_config
from mlm_jax.objectives import registry
from mlm_jax.objectives.mlm import MLM


class HalfWeightMLM(MLM):
  """MLM whose loss counts half, reporting the real tokens of each batch: a researcher's variant that
  overrides only what differs from MLM."""

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None):
    loss, sums = super().loss_sums(model, batch, dropout_key, activation_sharding)
    return 0.5 * loss, dict(sums, real_tokens=(batch["segment_ids"] > 0).sum().astype(jnp.float32))

  def summarize(self, sums) -> dict:
    return dict(super().summarize(sums), real_tokens=float(sums["real_tokens"]))

  @staticmethod
  def console(m: dict) -> str:
    return f"{MLM.console(m)}  real tokens {m['real_tokens']:.0f}"


SPEC = f"{__name__}:HalfWeightMLM"   # the module's name as imported here (by pytest or by path)


class RandomRows:
  """Rows of random tokens, the second half of each row padding; batch `step` is a function of `step`."""

  def batch(self, step: int) -> dict:
    ids = np.random.default_rng(step).integers(4, 63, (8, 16)).astype(np.int32)
    seg = np.repeat((np.arange(16) < 8)[None].astype(np.int32), 8, 0)
    return dict(input_ids=ids * seg, segment_ids=seg, positions=np.tile(np.arange(16, dtype=np.int32), (8, 1)),
                word_starts=np.ones_like(ids))

  def get_state(self) -> dict:
    return {}

  def set_state(self, state: dict) -> None:
    pass


def _run(config, workdir) -> list:
  run = resolve.resolve_for_compile(config, platform="cpu")
  config = run.config
  mesh = sharding.make_mesh(config.mesh, devices=jax.devices()[:1])   # one device compiles fastest
  trainer = trainer_lib.make_trainer(config, mesh, run.objective(config))
  assert type(trainer.objective).__name__ == "HalfWeightMLM"
  loop.Loop(trainer, str(workdir), RandomRows(), None, trainer.init, tokens_per_example=16, flops_per_token=1.0).run()
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_an_objective_outside_the_package_trains_and_resumes(tmp_path):
  c = default_config()
  c.objective = SPEC
  c.model.update(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  c.data.seq_len = 16
  c.train.update(steps=2, batch_size=8, log_every=1, save_every=2, peak_tflops_per_device=1.0)   # no peak measurement
  logged = _run(c, tmp_path)
  assert [m["step"] for m in logged] == [1, 2]
  assert all(m["real_tokens"] == 64 for m in logged), logged   # its own metric, in the log
  saved = workdir_files.read_config(str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["objective"] == SPEC
  assert registry.for_config(saved).__name__ == "HalfWeightMLM"

  again = saved.copy_and_resolve_references()
  again.train.steps = 4
  logged = _run(again, tmp_path)   # the workdir's config: resumes at step 2 with the same objective
  assert [m["step"] for m in logged] == [1, 2, 3, 4] and np.isfinite(logged[-1]["loss"])
