"""The fused sparse cross-entropy equals the textbook formula, values and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlm_jax.objectives import sparse_loss


def _reference(y, emb, bias, labels, weights):
  logits = y @ emb.T + bias
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return (nll * weights).sum(), (correct * weights).sum()


def test_values_and_gradients_match_autodiff_of_the_plain_formula():
  k = jax.random.split(jax.random.key(0), 4)
  n, h, v = 40, 16, 97
  y = jax.random.normal(k[0], (n, h))
  emb = 0.5 * jax.random.normal(k[1], (v, h))
  bias = 0.1 * jax.random.normal(k[2], (v,))
  labels = jax.random.randint(k[3], (n,), 0, v)
  weights = (jnp.arange(n) % 5 != 0).astype(jnp.float32)   # some unused slots
  ours = sparse_loss.sparse_cross_entropy(y, emb, bias, labels, weights)
  ref = _reference(y, emb, bias, labels, weights)
  np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5)
  np.testing.assert_allclose(ours[1], ref[1])
  g_ours = jax.grad(lambda *a: sparse_loss.sparse_cross_entropy(*a, labels, weights)[0], argnums=(0, 1, 2))(y, emb, bias)
  g_ref = jax.grad(lambda *a: _reference(*a, labels, weights)[0], argnums=(0, 1, 2))(y, emb, bias)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # Unused slots get no gradient.
  assert not np.asarray(g_ours[0])[np.asarray(weights) == 0].any()


def test_summarize():
  s = sparse_loss.summarize(dict(loss_sum=jnp.float32(6.0), correct_sum=jnp.float32(1.0),
                                num_predictions=jnp.float32(4.0)))
  np.testing.assert_allclose(s["loss"], 1.5)
  np.testing.assert_allclose(s["perplexity"], np.exp(1.5), rtol=1e-6)
  np.testing.assert_allclose(s["accuracy"], 0.25)


def test_z_loss_term_and_its_gradient_match_autodiff_of_the_plain_formula():
  """The third sum is PaLM's z-loss term sum_slots w log(Z)^2; its custom gradient (and that of a weighted total)
  equals autodiff of the plain formula."""
  k = jax.random.split(jax.random.key(1), 4)
  n, h, v = 24, 8, 53
  y, emb = jax.random.normal(k[0], (n, h)), jax.random.normal(k[1], (v, h))
  bias, labels = 0.3 * jax.random.normal(k[2], (v,)), jax.random.randint(k[3], (n,), 0, v)
  weights = (jnp.arange(n) % 4 != 0).astype(jnp.float32)
  lse = jax.nn.logsumexp(y @ emb.T + bias, axis=-1)
  np.testing.assert_allclose(sparse_loss.sparse_cross_entropy(y, emb, bias, labels, weights)[2],
                             (lse ** 2 * weights).sum(), rtol=1e-5)

  def ours(y, emb, bias):
    nll, _, zsq = sparse_loss.sparse_cross_entropy(y, emb, bias, labels, weights)
    return nll + 1e-2 * zsq

  def plain(y, emb, bias):
    logits = y @ emb.T + bias
    z = jax.nn.logsumexp(logits, axis=-1)
    return (_reference(y, emb, bias, labels, weights)[0] + 1e-2 * (z ** 2 * weights).sum())

  grads = [jax.jit(jax.grad(f, argnums=(0, 1, 2)))(y, emb, bias) for f in (ours, plain)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_z_loss_adds_exactly_its_weight_times_log_z_squared_to_the_mlm_loss():
  """loss.z_loss = 1e-4: MLM's differentiated loss is the cross-entropy plus 1e-4 x sum over the predicted slots of
  log(Z)^2, Z from the model's full logits at those slots; the logged loss stays the cross-entropy."""
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model.encoder import Encoder
  from mlm_jax.objectives.mlm import MLM
  c = default_config()
  c.model.update(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  c.masking.update(mask_id=49, special_ids=(0, 1, 2, 3), mask_rate=0.3)
  model = Encoder(c.model, seed=1)
  rng = np.random.default_rng(0)
  batch = dict(input_ids=jnp.asarray(rng.integers(4, 49, (3, 16)), jnp.int32), segment_ids=jnp.ones((3, 16), jnp.int32),
               positions=jnp.tile(jnp.arange(16), (3, 1)))
  from flax import nnx
  graphdef, params = nnx.split(model, nnx.Param)
  off = MLM.step(c)
  batch = jax.jit(off.prepare)(batch, jax.random.key(0))
  loss_of = lambda objective: jax.jit(lambda p, b: objective.loss_sums(nnx.merge(graphdef, p), b, None))(params, batch)
  loss0, sums0 = loss_of(off)
  c.loss.z_loss = 1e-4
  loss1, sums1 = loss_of(MLM.step(c))
  logits = jax.jit(lambda p, b: nnx.merge(graphdef, p).mlm_logits(nnx.merge(graphdef, p)(
      b["input_ids"], b["segment_ids"], b["positions"])))(params, batch)
  picked = jnp.take_along_axis(logits, batch["masked_positions"][..., None], axis=1)
  direct = float((jax.nn.logsumexp(picked, axis=-1) ** 2 * batch["masked_weights"]).sum())
  assert float(sums0["num_predictions"]) > 0 and float(loss0) == float(sums0["loss_sum"])
  np.testing.assert_allclose(float(loss1) - float(loss0), 1e-4 * direct, rtol=1e-4)
  assert float(sums1["loss_sum"]) == float(sums0["loss_sum"])
  assert MLM.step(c).summarize(jax.tree.map(float, sums1))["z_loss"] == pytest.approx(direct / float(sums1["num_predictions"]),
                                                                                rel=1e-5)
