"""optim.py: the warmup-stable-decay schedule at its boundaries, and per-tensor update clipping."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlm_jax.training import optim
from mlm_jax.config.defaults import default_config


def _opt(**kw):
  o = default_config().optimizer
  o.update(kw)
  return o


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_schedule_at_its_boundaries(shape):
  """100 steps: warmup 10, peak until step 80, the last 20 decay to 10% of the peak."""
  lr = optim.make_schedule(_opt(schedule="wsd", learning_rate=2.0, warmup_steps=10, decay_fraction=0.2,
                                decay_shape=shape, end_lr_ratio=0.1), 100)
  at = lambda step: float(lr(step))
  assert at(0) == 0.0 and at(5) == pytest.approx(1.0) and at(10) == pytest.approx(2.0)
  assert at(45) == at(80) == pytest.approx(2.0)
  assert at(100) == pytest.approx(0.2) and at(150) == pytest.approx(0.2)
  halfway = {"linear": 0.2 + 1.8 * 0.5, "cosine": 0.2 + 1.8 * 0.5, "1-sqrt": 0.2 + 1.8 * (1 - np.sqrt(0.5))}[shape]
  assert at(90) == pytest.approx(halfway, rel=1e-5)
  decaying = [at(s) for s in range(80, 101)]
  assert all(a > b for a, b in zip(decaying, decaying[1:]))


def test_wsd_decay_fraction_is_checked():
  with pytest.raises(ValueError, match=r"optimizer.decay_fraction=1.5"):
    optim.make_schedule(_opt(schedule="wsd", decay_fraction=1.5), 100)
  with pytest.raises(ValueError, match=r"optimizer.decay_shape='sqrt'"):
    optim.make_schedule(_opt(schedule="wsd", decay_shape="sqrt"), 100)


def _first_update(clip_rms):
  """One step of make_optimizer at lr 1, no decay, on a plain matrix and a stack of two scanned layers
  (layer 1 gets gradients on half its entries, so its Adam update has RMS ~0.71, layer 0's is ~1)."""
  rng = np.random.default_rng(0)
  params = {"head_kernel": jnp.zeros((8, 8)), "layer_groups": {"wi_kernel": jnp.zeros((2, 8, 16))}}
  stacked = rng.normal(size=(2, 8, 16)) * 5.0
  stacked[1, :4] = 0.0
  grads = {"head_kernel": jnp.asarray(rng.normal(size=(8, 8))),
           "layer_groups": {"wi_kernel": jnp.asarray(stacked)}}
  tx = optim.make_optimizer(_opt(learning_rate=1.0, warmup_steps=0, schedule="constant", weight_decay=0.0,
                                 clip_norm=0.0, update_clip_rms=clip_rms), 10)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  rms = lambda x, axes=None: np.sqrt(np.mean(np.square(np.asarray(x)), axis=axes))
  return updates, rms(updates["head_kernel"]), rms(updates["layer_groups"]["wi_kernel"], (1, 2))


def test_update_clipping_bounds_each_tensors_rms():
  plain, head, layers = _first_update(0.0)   # optax.adamw: the first Adam update is ~sign(g)
  assert head == pytest.approx(1.0, abs=1e-3) and layers == pytest.approx([1.0, np.sqrt(0.5)], abs=1e-3)
  clipped, head, layers = _first_update(0.8)
  assert head == pytest.approx(0.8, rel=1e-5)
  # Per layer: layer 0 is scaled to 0.8, layer 1 (below the bound) is left as it was.
  assert layers[0] == pytest.approx(0.8, rel=1e-5)
  np.testing.assert_array_equal(clipped["layer_groups"]["wi_kernel"][1], plain["layer_groups"]["wi_kernel"][1])
  loose, _, _ = _first_update(2.0)   # a bound above every RMS changes nothing: the same update as adamw
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), loose, plain)


def test_adam_without_bias_correction_takes_the_raw_moments():
  """BERT/ELECTRA's AdamWeightDecayOptimizer: the first update is (1 - b1) / sqrt(1 - b2) times
  optax's corrected one (~ lr * sign(g)), and later ones follow the uncorrected moments."""
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.array([0.5, -0.25, 2.0])}
  kw = dict(schedule="constant", learning_rate=1.0, warmup_steps=0, weight_decay=0.0, clip_norm=0.0)
  raw, corrected = (optim.make_optimizer(_opt(bias_correction=b, **kw), 10) for b in (False, True))
  u_raw, state = raw.update(grads, raw.init(params), params)
  u_cor, _ = corrected.update(grads, corrected.init(params), params)
  ratio = (1 - 0.9) / np.sqrt(1 - 0.999)
  np.testing.assert_allclose(u_raw["w"], ratio * u_cor["w"], rtol=1e-3)   # eps differs in weight
  np.testing.assert_allclose(u_cor["w"], -np.sign(grads["w"]), rtol=1e-4)
  u2, _ = raw.update(grads, state, params)   # the second step: moments decay from the first
  m, v = 0.1 * 1.9 * grads["w"], 0.001 * 1.999 * grads["w"] ** 2
  np.testing.assert_allclose(u2["w"], -m / (np.sqrt(v) + 1e-6), rtol=1e-4)
