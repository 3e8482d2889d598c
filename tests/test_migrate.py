"""Earlier workdirs read through the one migration module (workdir/migrate.py): config.json of any layout
version upgraded step by step, and checkpoints of older train-state layouts restored into today's.
(tests/test_round2_fixture.py resumes a whole workdir of round 2's code.)"""
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlm_jax.config import phases as phases_lib
from mlm_jax.config.defaults import default_config, optimizer_defaults
from mlm_jax.errors import CheckpointError
from mlm_jax.training import optim
from mlm_jax.training.trainer import TrainState
from mlm_jax.workdir import checkpoints, files as workdir_files, migrate, restore

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "round2"


def test_an_older_flat_config_json_is_upgraded_step_by_step():
  """The round-2 fixture's config.json (one flat resolved config, no version) reads as today's layout: the
  tokenizer's ids derived, the fields added since filled in as that run meant them."""
  raw = json.loads((FIXTURE / "workdir" / "config.json").read_text())
  assert migrate.version_of(raw) == 1 and "packing_fit" not in raw["data"]
  record = migrate.config_json(raw)
  assert migrate.version_of(record) == migrate.VERSION == record["version"]
  assert "mask_id" not in record["config"]["masking"]
  assert record["derived"]["masking"]["mask_id"] == raw["masking"]["mask_id"]
  resolved = workdir_files.resolved_of(raw)
  assert resolved.data.packing_fit == "next" and resolved.masking.mask_id == raw["masking"]["mask_id"]
  assert resolved.model.hidden_size == raw["model"]["hidden_size"] == 16
  assert migrate.config_json(record) == record   # today's layout is read as it is
  with pytest.raises(CheckpointError, match="newer than this mlm_jax reads"):
    migrate.config_json({**record, "version": migrate.VERSION + 1})


def test_phases_recorded_before_their_values_read_as_their_overrides_in_order():
  """A phase recorded without `values` is its own overrides over those of the phases before it; a field only
  a later phase sets keeps the last phase's value (config.json's sections)."""
  c = default_config()
  c.data.seq_len = 48
  raw = json.loads(c.to_json_best_effort())
  lr = raw["optimizer"]["learning_rate"]
  raw["phases"] = [[["name", "a"], ["end_step", 5], ["start_step", 0], ["data.seq_len", 32],
                    ["masking.mask_rate", 0.3]],
                   [["name", "b"], ["end_step", 10], ["start_step", 5], ["data.seq_len", 48]],
                   [["name", "c"], ["end_step", 20], ["start_step", 10], ["optimizer.learning_rate", 0.5]]]
  config = workdir_files.resolved_of(raw)
  got = {step: (a.data.seq_len, a.masking.mask_rate, a.optimizer.learning_rate)
         for step in (3, 7, 15) for a in [phases_lib.at_step(config, step)]}
  assert got == {3: (32, 0.3, lr), 7: (48, 0.3, lr), 15: (48, 0.3, 0.5)}


def _params():
  rng = np.random.default_rng(0)
  return {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}}


def test_an_optimizer_state_of_optax_adamw_resumes_into_todays_chain(tmp_path):
  """Runs before training/optim.py built AdamW's parts in its own chain saved optax.adamw's state nested
  (and, before train.ema_decay, no `ema`): restored, it is today's chain's state, array for array, and the
  next update is the one optax.adamw would make."""
  o = optimizer_defaults()
  o.clip_norm = 1.0
  schedule = optim.make_schedule(o, 100)
  old_tx = optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                                   mask=optim.decay_mask))
  tx = optim.make_optimizer(o, 100)
  params = _params()
  grads = jax.tree.map(lambda p: jnp.sin(p * 3.0), params)
  old_state = old_tx.init(params)
  for _ in range(3):
    _, old_state = old_tx.update(grads, old_state, params)
  old = {"step": jnp.asarray(3, jnp.int32), "params": params, "opt_state": old_state,
         "nonfinite": jnp.asarray(0, jnp.int32)}   # a TrainState as saved before it had `ema`
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(3, old, {"position": 1})
  ckpt.wait()

  today = TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                     nonfinite=jnp.asarray(0, jnp.int32))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), today)
  restored, data = restore.restore_state(ckpt, 3, abstract)
  ckpt.close()
  assert data == {"position": 1} and restored.ema is None and int(restored.step) == 3
  assert jax.tree.structure(restored.opt_state) == jax.tree.structure(today.opt_state)
  flat_old = jax.tree.leaves(old_state)
  assert len(flat_old) == len(jax.tree.leaves(restored.opt_state))
  for a, b in zip(flat_old, jax.tree.leaves(restored.opt_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  want, _ = old_tx.update(grads, old_state, params)
  got, _ = tx.update(grads, restored.opt_state, params)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_todays_train_state_restores_as_it_was_saved(tmp_path):
  o = optimizer_defaults()
  tx = optim.make_optimizer(o, 100)
  params = _params()
  state = TrainState(step=jnp.asarray(2, jnp.int32), params=params, opt_state=tx.init(params),
                     nonfinite=jnp.asarray(0, jnp.int32))
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(2, state, {})
  ckpt.wait()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
  restored, _ = restore.restore_state(ckpt, 2, abstract)
  ckpt.close()
  assert jax.tree.structure(restored) == jax.tree.structure(state)
