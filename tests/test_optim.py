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


def test_lamb_is_adam_with_the_trust_ratio_on_weight_matrices():
  """optimizer.name='lamb': two steps equal a direct computation of LAMB as BERT's and GPT-BERT's code run it
  (Adam with bias correction, + decay, times ||w|| / ||update|| for weight matrices; biases and norms take
  the plain Adam step); on weights alone it is optax.lamb; a stacked (scanned) tensor takes each layer's ratio."""
  import optax
  rng = np.random.default_rng(1)
  params = {"wi_kernel": jnp.asarray(rng.normal(size=(4, 3))), "wi_bias": jnp.asarray(rng.normal(size=(3,))),
            "head_norm": {"scale": jnp.ones((3,))}}
  grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params) for _ in range(2)]
  lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.98, 1e-6
  o = _opt(name="lamb", learning_rate=lr, warmup_steps=0, schedule="constant", weight_decay=wd, clip_norm=0.0,
           b1=b1, b2=b2, eps=eps)
  tx = optim.make_optimizer(o, 10)
  state, p = tx.init(params), params
  flat = lambda t: {"wi_kernel": t["wi_kernel"], "wi_bias": t["wi_bias"], "scale": t["head_norm"]["scale"]}
  direct = {k: np.asarray(x, np.float64) for k, x in flat(params).items()}
  m, v = {k: 0.0 for k in direct}, {k: 0.0 for k in direct}
  for t, g in enumerate(grads, start=1):
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
    for k, w in direct.items():
      gk = np.asarray(flat(g)[k], np.float64)
      m[k] = b1 * m[k] + (1 - b1) * gk
      v[k] = b2 * v[k] + (1 - b2) * gk ** 2
      u = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
      if k == "wi_kernel":   # decayed and trust-scaled; the bias and the norm scale take Adam's step
        u = u + wd * w
        u = u * np.linalg.norm(w) / np.linalg.norm(u)
      direct[k] = w - lr * u
  for k, ours in flat(p).items():
    np.testing.assert_allclose(ours, direct[k], rtol=1e-5, err_msg=k)

  weights = {"wi_kernel": params["wi_kernel"]}
  ref = optax.lamb(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
  ours_u, _ = tx.update({"wi_kernel": grads[0]["wi_kernel"]}, tx.init(weights), weights)
  ref_u, _ = ref.update({"wi_kernel": grads[0]["wi_kernel"]}, ref.init(weights), weights)
  np.testing.assert_allclose(ours_u["wi_kernel"], ref_u["wi_kernel"], rtol=1e-6)

  stacked = {"layer_groups": {"wi_kernel": jnp.stack([params["wi_kernel"], 3.0 * params["wi_kernel"]])}}
  g_stacked = {"layer_groups": {"wi_kernel": jnp.stack([grads[0]["wi_kernel"], grads[0]["wi_kernel"]])}}
  u_stacked, _ = tx.update(g_stacked, tx.init(stacked), stacked)
  for i, scale in enumerate((1.0, 3.0)):   # each layer as if it were its own tensor
    one = {"wi_kernel": scale * params["wi_kernel"]}
    u_one, _ = tx.update({"wi_kernel": grads[0]["wi_kernel"]}, tx.init(one), one)
    np.testing.assert_allclose(u_stacked["layer_groups"]["wi_kernel"][i], u_one["wi_kernel"], rtol=1e-6)
