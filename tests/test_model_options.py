"""Model variants from the config: modern options, remat, bf16 compute."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
import ml_collections

from mlm_jax.config.defaults import default_config
from mlm_jax.model.encoder import Encoder, dropout


def _cfg(**kw):
  c = default_config().model
  c.update(dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0), **kw)
  return c


def _inputs():
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(4, 97, (3, 16)), jnp.int32)
  seg = jnp.asarray(np.repeat([[1] * 10 + [2] * 4 + [0] * 2], 3, 0), jnp.int32)
  pos = jnp.asarray(np.repeat([list(range(10)) + list(range(4)) + [0, 0]], 3, 0), jnp.int32)
  return ids, seg, pos


def _loss(model, ids, seg, pos):
  h = model(ids, seg, pos)
  return (model.mlm_logits(h) ** 2).mean()


@pytest.mark.parametrize("opts", [dict(norm="pre"), dict(positions="rotary"), dict(mlp="geglu"),
                                  dict(norm="pre", positions="rotary", mlp="geglu", use_pooler=True)])
def test_modern_options_run_and_differentiate(opts):
  model = Encoder(_cfg(**opts))
  ids, seg, pos = _inputs()
  grads = nnx.grad(_loss)(model, ids, seg, pos)
  leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
  assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) >= len(leaves) - 2
  if opts.get("use_pooler"):
    assert model.pool(model(ids, seg, pos)).shape == (3, 32)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_training_attention_path_equals_fused_attention(positions):
  """The spelled-out attention used when attention dropout is on (masks, rotary) gives what
  jax.nn.dot_product_attention gives, once its dropout keeps (almost) everything."""
  model = Encoder(_cfg(positions=positions, attention_dropout=1e-9))
  ids, seg, pos = _inputs()
  real = np.asarray(seg) > 0
  train = model(ids, seg, pos, dropout_key=jax.random.key(3))
  np.testing.assert_allclose(np.asarray(train)[real], np.asarray(model(ids, seg, pos))[real], atol=1e-5)


def test_documents_do_not_attend_to_each_other():
  """Changing document 2 of a row leaves document 1's hidden states unchanged (segment masks)."""
  model = Encoder(_cfg())
  ids, seg, pos = _inputs()
  other = ids.at[:, 10:14].set(5)
  a, b = model(ids, seg, pos), model(other, seg, pos)
  np.testing.assert_allclose(a[:, :10], b[:, :10], atol=1e-6)
  assert not np.allclose(a[:, 10:14], b[:, 10:14])


def test_rotary_is_relative():
  """With rotary positions, shifting every position by the same amount changes nothing."""
  model = Encoder(_cfg(positions="rotary"))
  ids, seg, pos = _inputs()
  np.testing.assert_allclose(model(ids, seg, pos), model(ids, seg, pos + 7), atol=1e-5)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_gradients(remat):
  ids, seg, pos = _inputs()
  g0 = nnx.grad(_loss)(Encoder(_cfg()), ids, seg, pos)
  g1 = nnx.grad(_loss)(Encoder(_cfg(remat=remat)), ids, seg, pos)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_compute_keeps_fp32_params_and_logits():
  c = _cfg(dtype="bfloat16")
  model = Encoder(c)
  ids, seg, pos = _inputs()
  h = model(ids, seg, pos)
  assert h.dtype == jnp.bfloat16
  assert model.mlm_logits(h).dtype == jnp.float32
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  ref = Encoder(_cfg())(ids, seg, pos)
  np.testing.assert_allclose(np.asarray(h, np.float32), ref, atol=0.1)


def test_dropout_rate_and_scale():
  x = jnp.ones((256, 1024))
  y = dropout(x, 0.1, jax.random.key(0))
  dropped = float((y == 0).mean())
  assert abs(dropped - 0.1) < 0.005
  np.testing.assert_allclose(float(y.mean()), 1.0, atol=0.01)
  assert not np.array_equal(np.asarray(y), np.asarray(dropout(x, 0.1, jax.random.key(1))))
  assert dropout(x, 0.1, None) is x


def test_bad_model_config_is_named():
  with pytest.raises(ValueError, match="model.norm='mid'"):
    Encoder(_cfg(norm="mid"))
  with pytest.raises(ValueError, match="not divisible by model.num_heads=5"):
    Encoder(_cfg(num_heads=5))


def test_modernbert_switches_and_the_pre_ln_layout_of_older_configs():
  """The switches remove exactly their parameters; a pre-LN config.json from before `embedding_norm` (no such
  key) builds the model it described: no embedding norm, its final norm still named `embeddings_norm`."""
  from mlm_jax.model.encoder import abstract_model
  from mlm_jax.workdir.migrate import migrate_model   # an older config.json is completed once, when read
  names = lambda cfg: {".".join(map(str, p)) for p, _ in nnx.to_flat_state(abstract_model(migrate_model(cfg))[1])}
  modern = names(_cfg(norm="pre", embedding_norm=True, attention_bias=False, mlp_bias=False, norm_bias=False,
                              head_bias=False, first_layer_attention_norm=False, mlp="geglu"))
  assert {"embeddings_norm.scale", "final_norm.scale", "layers.1.attention_norm.scale", "decoder_bias"} <= modern
  assert not [n for n in modern if n.endswith("bias") and n != "decoder_bias"], modern
  assert not [n for n in modern if n.startswith("layers.0.attention_norm")]
  old = {k: v for k, v in _cfg(norm="pre").to_dict().items() if k not in ("embedding_norm", "first_layer_attention_norm")}
  legacy = names(ml_collections.ConfigDict(old))
  assert "embeddings_norm.scale" in legacy and not [n for n in legacy if n.startswith("final_norm")]
  assert "layers.0.attention_norm.bias" in legacy
  with pytest.raises(ValueError, match="first_layer_attention_norm=False needs model.norm='pre'"):
    Encoder(_cfg(first_layer_attention_norm=False))


def test_dropout_bits_do_not_repeat_past_two_to_the_32_elements():
  """xlmr_large's attention dropout draws over a global [8192, 16, 512, 512] array (2^35 elements): rows b,
  b + 1024 and b + 4096 must get their own bits (a uint32 flat index wraps there and repeats them). Points of
  the array are read through their coordinates, without building it; below 2^32 elements the index is the
  flat one, so smaller arrays keep their bits."""
  from mlm_jax.model.encoder import bits_at, dropout_bits, index_words
  shape = (8192, 16, 512, 512)
  rows = np.arange(0, 8192, 1024)   # 8 rows whose flat indices agree modulo 2^32
  n = 64   # 64 elements of each row, at the same (head, query, key) coordinates
  rng = np.random.default_rng(0)
  h, i, j = (rng.integers(0, d, n) for d in shape[1:])
  at = [np.repeat(rows, n), np.tile(h, len(rows)), np.tile(i, len(rows)), np.tile(j, len(rows))]
  high, low = index_words(shape, at=at)
  flat = sum(np.asarray(a, np.int64) * int(np.prod(shape[d + 1:])) for d, a in enumerate(at))
  assert np.array_equal(np.asarray(low, np.int64) + np.asarray(high, np.int64) * 16 * 512 * 512, flat)
  seeds = jax.random.bits(jax.random.key(0), (2,), jnp.uint32)
  bits = np.asarray(bits_at(high, low, seeds)).reshape(len(rows), n)
  assert len({row.tobytes() for row in bits}) == len(rows), "two rows share their dropout bits"
  # Every bit position is fair across these 512 draws (a wrapped or constant word would not be).
  ones = np.unpackbits(bits.view(np.uint8)).reshape(-1, 32).mean(0)
  assert np.all(np.abs(ones - 0.5) < 0.1), ones
  # Below 2^32 elements: the high word is 0 and the bits are the flat index's, as a whole array draws them.
  small = (3, 5, 7)
  high, low = index_words(small)
  assert not np.asarray(high).any() and np.array_equal(np.asarray(low).ravel(), np.arange(105))
  whole = np.asarray(dropout_bits(jax.random.key(0), small))
  assert np.array_equal(whole, np.asarray(bits_at(high, low, seeds)))


def test_ltg_switches_change_the_model_and_to_hf_refuses_them():
  """model.extra_norms adds a LayerNorm on each attention output and FFN activation (other outputs);
  model.layer_weighting adds ELC-BERT's weights, starts as the plain stack (same outputs), gets a gradient and
  changes the outputs once they move; to_hf refuses either in one line, layer weighting refuses scanned layers;
  an older config.json (without the fields) builds the plain model."""
  from mlm_jax.convert import bert
  from mlm_jax.errors import ConversionError
  from mlm_jax.workdir.migrate import migrate_model
  ids, seg, pos = _inputs()
  flat = lambda m: {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))}
  base = Encoder(_cfg())
  plain = np.asarray(base(ids, seg, pos))

  normed = Encoder(_cfg(extra_norms=True))
  assert flat(normed) - flat(base) == {f"layers.{i}.{n}" for i in range(2) for n in
                                       ("attention.out_norm.scale", "attention.out_norm.bias",
                                        "mlp.hidden_norm.scale", "mlp.hidden_norm.bias")}
  assert np.abs(np.asarray(normed(ids, seg, pos)) - plain).max() > 1e-2
  g = nnx.grad(_loss)(normed, ids, seg, pos)
  for i in range(2):   # each norm is on the path: its scale gets a gradient
    assert np.abs(np.asarray(g.layers[i].attention.out_norm.scale[...])).min() > 0
    assert np.abs(np.asarray(g.layers[i].mlp.hidden_norm.scale[...])).min() > 0

  weighted = Encoder(_cfg(layer_weighting=True))
  assert flat(weighted) - flat(base) == {"layer_weights"}
  np.testing.assert_allclose(np.asarray(weighted(ids, seg, pos)), plain, atol=1e-6)
  grads = nnx.grad(_loss)(weighted, ids, seg, pos)
  g = np.asarray(grads.layer_weights[...])
  assert np.abs(g[0, :2]).min() > 0 and np.abs(g[1, :3]).min() > 0
  weighted.layer_weights[...] = weighted.layer_weights[...] + 0.3
  assert np.abs(np.asarray(weighted(ids, seg, pos)) - plain).max() > 1e-2

  for field in ("extra_norms", "layer_weighting"):
    for arch in ("xlm-roberta", "modernbert"):
      with pytest.raises(ConversionError, match=rf"^model.{field}=True \(an LTG-BERT / ELC-BERT switch\) has no "
                                                r"equivalent in transformers: this model cannot be exported"):
        bert.hf_config(_cfg(**{field: True}), arch, pad_token_id=1)
  with pytest.raises(ValueError, match="layer_weighting=True needs model.scan_layers=False"):
    Encoder(_cfg(layer_weighting=True, scan_layers=True))
  old = ml_collections.ConfigDict({k: v for k, v in _cfg().to_dict().items() if k not in ("extra_norms", "layer_weighting")})
  assert flat(Encoder(migrate_model(old))) == flat(base)
