"""An objective defined outside the package, in this file, trains through make_trainer and the one loop
(mlm_jax/training/loop.py) with no package file edited: `config.objective = "module:Class"` names it, config.json
keeps that string, and a resumed run (and anything that reads the workdir) finds the class again."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mlm_jax.training import loop, resolve, trainer as trainer_lib
from mlm_jax.model import sharding
from mlm_jax.workdir import files as workdir_files
from mlm_jax.config.defaults import default_config
from mlm_jax.objectives import registry
from mlm_jax.objectives.mlm import MLM, MLMStep
from mlm_jax.errors import ConfigError


class HalfWeightStep(MLMStep):
  """MLM's step whose loss counts half, reporting the masked rows of each batch: a researcher's variant that
  overrides only what differs from MLM (its metric's name is its own: the step writes real_tokens)."""

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None, values=None):
    loss, sums = super().loss_sums(model, batch, dropout_key, activation_sharding, values)
    return 0.5 * loss, dict(sums, rows_seen=(batch["segment_ids"] > 0).any(-1).sum().astype(jnp.float32))

  def summarize(self, sums) -> dict:
    return dict(super().summarize(sums), rows_seen=float(sums["rows_seen"]))

  @staticmethod
  def console(m: dict) -> str:
    return f"{MLMStep.console(m)}  rows {m['rows_seen']:.0f}"


class HalfWeightMLM(MLM):
  """The objective: MLM's description, answered by MLM but for its step."""
  step = HalfWeightStep


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
  trainer = trainer_lib.make_trainer(config, mesh, run.objective)
  assert type(trainer.objective).__name__ == "HalfWeightStep" and trainer.description.__name__ == "HalfWeightMLM"
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
  assert all(m["rows_seen"] == 8 for m in logged), logged   # its own metric, in the log (8 rows a batch)
  saved = workdir_files.read_config(str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["config"]["objective"] == SPEC   # as the user gave it
  assert registry.for_config(saved).__name__ == "HalfWeightMLM"

  again = saved.copy_and_resolve_references()
  again.train.steps = 4
  logged = _run(again, tmp_path)   # the workdir's config: resumes at step 2 with the same objective
  assert [m["step"] for m in logged] == [1, 2, 3, 4] and np.isfinite(logged[-1]["loss"])


def test_the_plugin_loss_is_the_one_differentiated():
  """The plugin's 0.5 x MLM loss is what the step differentiates: from the same parameters and batch,
  its gradient norm is half MLM's (the logged loss is the summary's, the same for both)."""
  c = default_config()
  c.model.update(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  c.data.seq_len = 16
  c.train.update(steps=2, batch_size=8)
  norms = {}
  for name in ("mlm", SPEC):
    c.objective = name
    run = resolve.resolve_for_compile(c, platform="cpu")
    mesh = sharding.make_mesh(run.config.mesh, devices=jax.devices()[:1])
    trainer = trainer_lib.make_trainer(run.config, mesh, run.objective)
    batch = sharding.global_batch(RandomRows().batch(0), trainer.batch_sharding)
    _, m = trainer.train_step(trainer.init(), batch, jax.random.key(0), trainer.values)
    norms[name] = float(m["grad_norm"])
  assert norms[SPEC] == pytest.approx(0.5 * norms["mlm"], rel=1e-4), norms


def test_a_config_json_names_only_objective_classes(tmp_path, monkeypatch):
  """A workdir's config.json may name a registry objective or a module's objective class: a function
  (subprocess:call, or one of a planted module) is refused in one line before its module is imported; a
  class without the objective interface is refused before anything of it is called."""
  marker = tmp_path / "imported"
  (tmp_path / "planted_mod.py").write_text(
      f"open({str(marker)!r}, 'w').close()\n\ndef Run(config):\n  raise SystemExit('called')\n\n"
      "class NotAnObjective:\n  pass\n\n"
      "from mlm_jax.objectives.interface import Description\n\nclass StepIsNoStep(Description):\n  step = object\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  for spec, why in [("subprocess:call", "subprocess defines no class call"),
                    ("planted_mod:Run", "planted_mod defines no class Run"),
                    ("no_such_module_here:X", "no module no_such_module_here is installed")]:
    with pytest.raises(ConfigError) as e:
      registry.for_config(ml_collections.ConfigDict(dict(objective=spec)))
    assert str(e.value).startswith(f"config.json objective={spec!r}: {why}") and "\n" not in str(e.value)
  assert not marker.exists()
  with pytest.raises(ConfigError, match=r"not an objective class \(it lacks bind, check"):
    registry.for_config(ml_collections.ConfigDict(dict(objective="planted_mod:NotAnObjective")))
  with pytest.raises(ConfigError, match=r"not an objective class \(it lacks step.prepare, step.loss_sums"):
    registry.for_config(ml_collections.ConfigDict(dict(objective="planted_mod:StepIsNoStep")))
  assert registry.for_config(ml_collections.ConfigDict(dict(objective="electra"))).__name__ == "Electra"
  assert registry.for_config(ml_collections.ConfigDict(dict(objective=SPEC))) is HalfWeightMLM
