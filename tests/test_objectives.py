"""The fused sparse cross-entropy equals the textbook formula, values and gradients."""
import jax
import jax.numpy as jnp
import numpy as np

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
