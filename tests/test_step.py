"""The sharded train step: same numbers on 1 and 8 devices, parameters sharded by the rules, learns."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from mlm_jax.model import sharding
from mlm_jax.training import trainer as trainer_lib
from mlm_jax.config.defaults import default_config
from mlm_jax.objectives.mlm import MLM

import textdata


def tiny_config(**model):
  c = default_config()
  c.model.update(dict(vocab_size=textdata.VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=128), **model)
  c.masking.mask_id = textdata.MASK
  c.masking.special_ids = textdata.SPECIALS
  c.optimizer.warmup_steps = 0   # the first step's learning rate is the peak: it moves every parameter
  c.train.steps = 10
  c.train.batch_size = 8
  return c


@pytest.fixture(scope="module")
def batch(shared_data):
  sp, lines = textdata.load(shared_data)
  return textdata.packed_batches(sp, lines[200:], seq_len=64, max_rows=8)


@pytest.fixture(scope="module")
def still():
  """A 1-device trainer without dropout, at a constant learning rate from step 0: the overfitting run, the
  full-batch side of gradient accumulation and the non-finite step share its compiled step."""
  c = tiny_config(hidden_size=64, intermediate_size=128, hidden_dropout=0.0, attention_dropout=0.0)
  c.mesh.update(dict(data=1, fsdp=1, tensor=1))
  c.optimizer.update(dict(learning_rate=3e-3, schedule="constant", weight_decay=0.0))
  c.train.steps = 400
  return trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), MLM)


def _one_step(c, mesh, batch, tr=None):
  tr = tr or trainer_lib.make_trainer(c, mesh, MLM)
  state = tr.init()
  new, metrics = tr.train_step(state, jax.device_put(batch, tr.batch_sharding), jax.random.key(0), tr.values)
  return tr, new, jax.tree.map(np.asarray, metrics)


def test_eight_devices_match_one(batch):
  assert len(jax.devices()) >= 8, "conftest sets 8 fake CPU devices"
  c = tiny_config()
  c.mesh.update(dict(data=1, fsdp=1, tensor=1))
  _, s1, m1 = _one_step(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), batch)
  c.mesh.update(dict(data=2, fsdp=2, tensor=2))
  mesh8 = sharding.make_mesh(c.mesh, jax.devices()[:8])
  tr8, s8, m8 = _one_step(c, mesh8, batch)
  assert m1["num_predictions"] == m8["num_predictions"] > 0
  np.testing.assert_allclose(m8["loss_sum"], m1["loss_sum"], rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(s1.params), jax.tree.leaves(s8.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7,
                               err_msg=jax.tree_util.keystr(path))

  # The parameters (and Adam's moments) really are laid out as the rules say.
  specs = {jax.tree_util.keystr(p): x.sharding.spec for p, x in jax.tree_util.tree_leaves_with_path(s8.params)}
  expect = {
      "['word_embeddings'].value": P("tensor", "fsdp"),
      "['position_embeddings'].value": P(None, "fsdp"),
      "['layers'][0]['attention']['q_kernel'].value": P("fsdp", "tensor", None),
      "['layers'][0]['attention']['o_kernel'].value": P("tensor", None, "fsdp"),
      "['layers'][1]['mlp']['wi_kernel'].value": P("fsdp", "tensor"),
      "['layers'][1]['mlp']['wo_kernel'].value": P("tensor", "fsdp"),
      "['decoder_bias'].value": P("tensor"),
  }
  for name, spec in expect.items():
    assert specs[name] == spec, (name, specs[name])
  q = s8.params["layers"][0]["attention"]["q_kernel"][...]
  assert q.addressable_shards[0].data.shape == (16, 2, 8)   # [32/fsdp, 4/tensor, 8]
  mu = s8.opt_state[1].mu["word_embeddings"][...]
  assert mu.sharding.spec == P("tensor", "fsdp")


def test_grad_accumulation_matches_full_batch(batch, still):
  c = still.config.copy_and_resolve_references()
  _, full, mf = _one_step(c, still.mesh, batch, still)
  c.optimizer.grad_accum_steps = 4
  _, acc, ma = _one_step(c, still.mesh, batch)
  np.testing.assert_allclose(ma["loss_sum"], mf["loss_sum"], rtol=1e-5)
  np.testing.assert_allclose(ma["grad_norm"], mf["grad_norm"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(acc.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_grad_accumulation_keeps_each_microbatch_on_every_device():
  """Microbatches take every n-th row, so each device's rows split evenly over them: compiled on 8
  devices, the step with 4 microbatches has the collectives of the one without (contiguous blocks put
  each microbatch on 2 of the 8 devices: 10 all-gathers and 13 collective-permutes instead of 3 and 0)."""
  from mlm_jax.training import hlo_collectives
  counts = {}
  for accum in (1, 4):
    c = tiny_config()
    c.mesh.update(dict(data=8, fsdp=1, tensor=1))
    c.train.batch_size = 32
    c.optimizer.grad_accum_steps = accum
    tr = trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:8]), MLM)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), jax.eval_shape(tr.init),
                         tr.state_sharding)
    batch = {k: jax.ShapeDtypeStruct((32, 64), np.int32, sharding=tr.batch_sharding)
             for k in ("input_ids", "segment_ids", "positions", "word_starts")}
    hlo = tr.train_step.lower(state, batch, jax.random.key(0), tr.values).compile().as_text()
    counts[accum] = {k: v["count"] for k, v in hlo_collectives.summary(hlo)["by_kind"].items()}
  assert "collective-permute" not in counts[4], counts
  assert counts[4].get("all-gather", 0) == counts[1].get("all-gather", 0), counts


def test_nonfinite_update_is_skipped_and_counted(batch, still):
  tr = still
  state = tr.init()
  # NaN in every 1-D parameter (biases, norms): the loss and all gradients become NaN. Laid out as the
  # state the step was compiled for (the same executable, not a second compile).
  poisoned = jax.device_put(
      state.replace(params=jax.tree.map(lambda x: x * np.float32("nan") if x.ndim == 1 else x, state.params)),
      tr.state_sharding)
  new, m = tr.train_step(poisoned, jax.device_put(batch, tr.batch_sharding), jax.random.key(0), tr.values)
  assert float(m["finite"]) == 0.0 and int(new.nonfinite) == 1
  # The step did not apply anything: params are the (poisoned) inputs, Adam's moments untouched.
  assert int(new.step) == 1
  for a in jax.tree.leaves(new.opt_state[1].mu):
    assert not np.asarray(a).any()
  # ... but counted it: the optimizer's step counters (the learning-rate schedule's, Adam's) move with
  # `step`, so the rate applied from here on is the one logged for each step.
  counters = [x for x in jax.tree.leaves(new.opt_state) if jnp.issubdtype(x.dtype, jnp.integer)]
  assert counters and all(int(c) == int(new.step) for c in counters), [int(c) for c in counters]


def test_tiny_model_overfits_a_fixed_batch_of_real_text(batch, still):
  tr, c = still, still.config
  state = tr.init()
  b = jax.device_put(batch, tr.batch_sharding)
  key = jax.random.key(0)
  losses = []
  for i in range(c.train.steps):
    state, m = tr.train_step(state, b, key, tr.values)
    if i % 20 == 19:
      losses.append(float(m["loss_sum"] / m["num_predictions"]))
      if losses[-1] < 1.0 and len(losses) > 2 and losses[-2] < 1.0:
        break
  assert losses[0] > 3.0 and min(losses) < 1.0, losses


def test_modernbert_config_shrunk_learns(batch):
  """configs/modernbert_base.py:extend with its model switches, scanned layers (layer 0 unrolled), WSD schedule
  (constant, then 1-sqrt decay) and update clipping, shrunk to 4 layers of width 32: 20 steps on real text
  lower the MLM loss. The pretrain phase differs in numbers only (checked here)."""
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "modernbert_base.py"
  spec = importlib.util.spec_from_file_location("modernbert_base", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  first, c = module.get_config("pretrain"), module.get_config("extend")
  assert (first.data.seq_len, first.model.rope_theta, first.optimizer.decay_fraction) == (1024, 10_000.0, 0.0)
  assert (c.data.seq_len, c.model.rope_theta, c.model.rope_theta_local) == (8192, 160_000.0, 10_000.0)
  assert c.model.scan_layers and c.optimizer.schedule == "wsd" and c.optimizer.update_clip_rms == 1.0
  c.model.update(dict(vocab_size=textdata.VOCAB, hidden_size=32, num_heads=2, intermediate_size=48, num_layers=4,
                      local_window=16, dtype="float32"))
  c.masking.update(dict(mask_id=textdata.MASK, special_ids=textdata.SPECIALS))
  c.optimizer.learning_rate = 1e-2
  c.train.update(dict(steps=20, batch_size=8))
  c.mesh.update(dict(data=1, fsdp=1, tensor=1))
  tr = trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), MLM)
  state = tr.init()
  assert "lead_layers" in state.params and "final_norm" in state.params
  b = jax.device_put(batch, tr.batch_sharding)
  losses = []
  for _ in range(c.train.steps):
    state, m = tr.train_step(state, b, jax.random.key(0), tr.values)
    losses.append(float(m["loss_sum"] / m["num_predictions"]))
  assert np.isfinite(losses).all() and np.mean(losses[-4:]) < np.mean(losses[:4]) - 1.0, losses
