"""Scanned layers: same numbers as the unrolled model, layouts that convert both ways, HF export."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlm_jax.workdir import restore
from mlm_jax.model import scan_layout, sharding
from mlm_jax.model.encoder import abstract_model
from mlm_jax.convert import bert
from mlm_jax.config.defaults import default_config
from mlm_jax.model.encoder import Encoder


def _cfg(**kw):
  c = default_config().model
  # 3 layers with a global one every 2: a scanned group of (global, local) and one unrolled layer.
  c.update(dict(vocab_size=61, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64,
                max_position_embeddings=32, global_attention_every=2, local_window=6, hidden_dropout=0.0))
  c.update(kw)
  return c


def _inputs():
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(4, 61, (2, 16)), jnp.int32)
  seg = jnp.asarray([[1] * 9 + [2] * 5 + [0] * 2, [1] * 16], jnp.int32)
  pos = jnp.asarray([list(range(9)) + list(range(5)) + [0, 0], list(range(16))], jnp.int32)
  return ids, seg, pos


def _params(model):
  return nnx.state(model, nnx.Param)


def _init(cfg):
  """The model's initial parameters from one jit (eagerly, each op of the init compiles on its own)."""
  return jax.jit(lambda: _params(Encoder(cfg)))()


@pytest.fixture(scope="module")
def unscanned_params():
  """The unscanned model's initial parameters; dropout, remat and the attention pattern add none."""
  return _init(_cfg())


def _model(cfg, params):
  return nnx.merge(abstract_model(cfg)[0], params)


def _forward_and_grads(model, key):
  """Hidden states and parameter gradients of a small loss, in one jit (eager grads take seconds)."""
  graphdef, params = nnx.split(model, nnx.Param)
  ids, seg, pos = _inputs()

  def loss(p):
    m = nnx.merge(graphdef, p)
    hidden = m(ids, seg, pos, dropout_key=key)
    return (m.mlm_logits(hidden) ** 2).mean(), hidden

  (_, hidden), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return hidden, grads


def test_scanned_init_is_the_unscanned_init_restacked(unscanned_params):
  unscanned, scanned = unscanned_params, _init(_cfg(scan_layers=True))
  restacked = bert.flatten(scan_layout.scan_params(unscanned, _cfg()))
  for name, value in bert.flatten(scanned).items():
    np.testing.assert_array_equal(value, restacked[name], err_msg=name)
  back = bert.flatten(scan_layout.unscan_params(scanned, _cfg(scan_layers=True)))
  for name, value in bert.flatten(unscanned).items():
    np.testing.assert_array_equal(value, back[name], err_msg=name)


def test_scanned_model_gives_the_unscanned_outputs_and_gradients(unscanned_params):
  """With dropout on (the same key per layer), remat inside the scan, and converted params."""
  opts = dict(remat="dots", attention_dropout=0.1)   # hidden dropout off: half the compile time
  unscanned = _model(_cfg(**opts), unscanned_params)
  scanned = _model(_cfg(scan_layers=True, **opts), scan_layout.scan_params(unscanned_params, _cfg()))
  key = jax.random.key(7)
  h_scanned, g_scanned = _forward_and_grads(scanned, key)
  h_unscanned, g_unscanned = _forward_and_grads(unscanned, key)
  np.testing.assert_allclose(h_scanned, h_unscanned, atol=1e-5)
  g_unscanned = bert.flatten(g_unscanned)
  for name, value in bert.flatten(scan_layout.unscan_params(g_scanned, _cfg(scan_layers=True))).items():
    np.testing.assert_allclose(value, g_unscanned[name], rtol=1e-4, atol=1e-7, err_msg=name)


def test_scanned_params_export_to_hf_and_import_back(unscanned_params):
  """to_hf of a scanned run writes the same tensors as the unscanned model; from_hf fills a scanned template."""
  cfg = _cfg(global_attention_every=0)
  scanned_params = scan_layout.scan_params(unscanned_params, cfg)
  sd = bert.params_to_hf(scanned_params, _cfg(global_attention_every=0, scan_layers=True), "bert")
  want = bert.params_to_hf(unscanned_params, cfg, "bert")
  assert sd.keys() == want.keys()
  for name in want:
    np.testing.assert_array_equal(sd[name], want[name], err_msg=name)
  scan_cfg = _cfg(global_attention_every=0, scan_layers=True)
  _, template = abstract_model(scan_cfg)
  back = bert.flatten(bert.params_from_hf(sd, scan_cfg, "bert", template))
  for name, value in bert.flatten(scanned_params).items():
    np.testing.assert_array_equal(value, back[name], err_msg=name)


def test_stacked_axis_uses_the_layers_rule():
  """The leading axis of stacked params is the logical `layers` axis (replicated by default rules)."""
  _, abstract = abstract_model(_cfg(scan_layers=True))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]).reshape(1, 2, 1), sharding.AXES)
  shardings = sharding.state_shardings(abstract, mesh, default_config().sharding.rules)
  spec = shardings["layer_groups"]["layers"][0]["mlp"]["wi_kernel"].get_value().spec
  assert tuple(spec) == (None, "fsdp", "tensor")


def test_init_from_restacks_a_checkpoint_of_the_other_layout(tmp_path, unscanned_params):
  """config.init_from with another model.scan_layers than the source run: same model, either way."""
  import json
  from mlm_jax.workdir import checkpoints
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=1, async_save=False)
  ckpt.save(0, {"params": unscanned_params, "step": jnp.zeros((), jnp.int32)}, {})
  ckpt.close()
  (tmp_path / "config.json").write_text(json.dumps(dict(model=_cfg().to_dict())))
  scanned_cfg = _cfg(scan_layers=True)
  _, abstract = abstract_model(scanned_cfg)
  params = restore.restore_params_for(str(tmp_path), scanned_cfg, restore.single_device(abstract))
  forward = lambda cfg: jax.jit(lambda p, *inputs: _model(cfg, p)(*inputs))   # one compile, not one per op
  ids, seg, pos = _inputs()
  np.testing.assert_allclose(np.asarray(forward(scanned_cfg)(params, ids, seg, pos)),
                             np.asarray(forward(_cfg())(unscanned_params, ids, seg, pos)), atol=1e-6)
