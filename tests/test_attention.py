"""Attention implementations against the dense xla path and a numpy reference; local/global layers.

Splash runs in Pallas interpret mode on CPU (the same kernel code as on TPU). Only real
(non-padding) positions are compared: padding rows attend to padding in splash and to nothing in xla.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from mlm_jax.model import attention, flops, sharding
from mlm_jax.config.defaults import default_config
from mlm_jax.model.encoder import Encoder

S = 128   # splash's smallest block


def _segments():
  """Row 0: two packed documents and padding; row 1: one document and padding."""
  seg = np.zeros((2, S), np.int32)
  seg[0, :50], seg[0, 50:110] = 1, 2
  seg[1, :97] = 1
  pos = np.zeros_like(seg)
  pos[0, :50], pos[0, 50:110], pos[1, :97] = np.arange(50), np.arange(60), np.arange(97)
  return jnp.asarray(seg), jnp.asarray(pos)


def _qkv(heads=2, head_dim=16):
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.normal(size=(2, S, heads, head_dim)), jnp.float32) for _ in range(3)]


def reference(q, k, v, segment_ids, window=0):
  """Softmax over the keys a token may see, in float64 numpy."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  seg = np.asarray(segment_ids)
  idx = np.arange(seg.shape[1])
  mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
  if window:
    mask &= np.abs(idx[:, None] - idx[None, :]) <= window // 2
  logits = np.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
  logits = np.where(mask[:, None], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True, initial=-1e300, where=mask[:, None]))
  probs = np.where(mask[:, None], probs, 0.0)
  probs /= np.maximum(probs.sum(-1, keepdims=True), 1e-300)
  return np.einsum("bnqk,bknd->bqnd", probs, v)


def _close_grads(a, b, rtol=1e-4):
  """Every gradient within rtol of the largest reference gradient (the float32 noise floor of tiny
  leaves, such as the query biases, is relative to the gradient's scale, not to the leaf's)."""
  pairs = [(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  scale = max(np.abs(y).max() for _, y in pairs)
  worst = max(np.abs(x - y).max() for x, y in pairs)
  assert worst <= rtol * scale, (worst, scale)


@pytest.mark.parametrize("window", [0, 32])
def test_xla_and_splash_match_the_reference(window):
  q, k, v = _qkv()
  seg, _ = _segments()
  real = np.asarray(seg) > 0
  want = reference(q, k, v, seg, window)
  xla = jax.nn.dot_product_attention(q, k, v, mask=attention.dense_mask(seg, window))
  splash = attention.splash_attention(q, k, v, seg, window)
  np.testing.assert_allclose(np.asarray(xla)[real], want[real], atol=1e-5)
  np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(xla)[real], atol=1e-5)

  def loss(fn):
    return lambda q, k, v: jnp.where(real[:, :, None, None], fn(q, k, v), 0.0).sum() * 3.0
  g_xla = jax.grad(loss(lambda *a: jax.nn.dot_product_attention(*a, mask=attention.dense_mask(seg, window))),
                   (0, 1, 2))(q, k, v)
  g_splash = jax.grad(loss(lambda *a: attention.splash_attention(*a, seg, window)), (0, 1, 2))(q, k, v)
  _close_grads(g_splash, g_xla)


def test_cudnn_lengths_mean_padding_only_rows():
  """The cudnn path's per-row lengths give the padding mask (checked through XLA's implementation)."""
  q, k, v = _qkv()
  seg = jnp.asarray((np.arange(S)[None, :] < np.array([[128], [97]])).astype(np.int32))
  out = attention.cudnn_attention(q, k, v, seg, implementation="xla")
  real = np.asarray(seg) > 0
  np.testing.assert_allclose(np.asarray(out)[real], reference(q, k, v, seg)[real], atol=1e-5)


def _cfg(**kw):
  c = default_config().model
  c.update(dict(vocab_size=61, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64,
                max_position_embeddings=S, hidden_dropout=0.0, attention_dropout=0.0, positions="rotary",
                norm="pre", global_attention_every=2, local_window=32, rope_theta_local=500.0))
  c.update(kw)
  return c


def _model_loss(model, ids, seg, pos, real):
  return (jnp.where(real[..., None], model(ids, seg, pos), 0.0) ** 2).sum()


def test_splash_model_matches_xla_with_rotary_local_global_and_packing():
  """Whole encoder (rotary, local + global layers, packed documents, padding): outputs and gradients."""
  seg, pos = _segments()
  ids = jnp.asarray(np.random.default_rng(1).integers(4, 61, (2, S)), jnp.int32)
  real = np.asarray(seg) > 0
  xla = Encoder(_cfg(attention_impl="xla"))
  splash = Encoder(_cfg(attention_impl="splash"))
  np.testing.assert_allclose(np.asarray(splash(ids, seg, pos))[real], np.asarray(xla(ids, seg, pos))[real],
                             atol=1e-5)
  _close_grads(nnx.grad(_model_loss)(splash, ids, seg, pos, real), nnx.grad(_model_loss)(xla, ids, seg, pos, real))


def test_splash_under_shard_map_matches_xla():
  """The sharded path (batch over data, heads over tensor) on 4 fake CPU devices."""
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:4]).reshape(2, 1, 2), sharding.AXES)
  q, k, v = _qkv()
  seg, _ = _segments()
  real = np.asarray(seg) > 0
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P(sharding.BATCH_AXES)))
  out = jax.jit(lambda q, k, v, s: attention.splash_attention(q, k, v, s, 32, mesh))(*map(put, (q, k, v, seg)))
  np.testing.assert_allclose(np.asarray(out)[real], reference(q, k, v, seg, 32)[real], atol=1e-5)


def test_local_layers_follow_the_modernbert_pattern():
  """Layer i is global when i % global_attention_every == 0; local ones see |i - j| <= window / 2."""
  cfg = _cfg(num_layers=7, global_attention_every=3)
  assert [attention.layer_window(cfg, i) for i in range(7)] == [0, 32, 32, 0, 32, 32, 0]
  assert [attention.layer_window(_cfg(global_attention_every=0), i) for i in range(3)] == [0, 0, 0]
  encoder = Encoder(cfg)
  assert encoder.layers[1].attention.rope_theta == 500.0 and encoder.layers[3].attention.rope_theta == 10000.0


def test_resolve_impl():
  base = _cfg(global_attention_every=0, dtype="bfloat16")
  assert attention.resolve_impl(base, "tpu", 512)[0] == "splash"
  assert attention.resolve_impl(base, "cpu", 512)[0] == "xla"
  assert attention.resolve_impl(base, "gpu", 512, packed_documents=False)[0] == "cudnn"
  impl, why = attention.resolve_impl(base, "gpu", 512, packed_documents=True)
  assert impl == "xla" and "packed documents" in why
  impl, why = attention.resolve_impl(_cfg(attention_dropout=0.1), "tpu", 512)
  assert impl == "xla" and "model.attention_dropout=0.1" in why
  from mlm_jax.workdir import migrate   # an older config.json's '' is read as auto
  assert attention.resolve_impl(migrate.migrate_model(_cfg(attention_impl="")), "tpu", 512)[0] == "splash"
  with pytest.raises(ValueError, match="model.attention_impl=splash: .*data.seq_len"):
    attention.resolve_impl(_cfg(attention_impl="splash"), "tpu", 200)
  with pytest.raises(ValueError, match="model.attention_impl=cudnn: .*local window"):
    attention.resolve_impl(_cfg(attention_impl="cudnn", dtype="bfloat16"), "gpu", 512, packed_documents=False)
  for unknown in ("flash", ""):
    with pytest.raises(ValueError, match="model.attention_impl"):
      attention.validate_model_config(_cfg(attention_impl=unknown))
  with pytest.raises(ValueError, match="model.attention_impl=splash has no attention dropout"):
    attention.make_context(_cfg(attention_impl="splash", attention_dropout=0.1), _segments()[0], training=True)
  with pytest.raises(ValueError, match="model.local_window"):
    attention.validate_model_config(_cfg(local_window=7))


def test_flops_count_windowed_attention():
  full = flops.flops_per_token(_cfg(global_attention_every=0), 8192, 8192)
  local = flops.flops_per_token(_cfg(), 8192, 8192)
  # Layers 0 and 2 are global; layer 1 attends to 33 keys instead of 8192.
  assert full - local == pytest.approx(12 * 32 * (8192 - 33))


def test_configs_of_older_runs_without_the_new_fields_still_build():
  """config.json files written before these options lack their fields: they mean all-global, unscanned."""
  import ml_collections
  from mlm_jax.model import encoder
  from mlm_jax.workdir import migrate
  old = ml_collections.ConfigDict({k: v for k, v in _cfg().to_dict().items() if k not in attention.NEW_FIELDS})
  _, params = encoder.abstract_model(migrate.migrate_model(old))   # completed once, when config.json is read
  assert "layers" in params and flops.attended_keys(old, 128) == 3 * 128
