"""ELECTRA (Clark et al., 2020, arXiv:2003.10555): replaced-token detection, `config.objective='electra'`.

A small generator is trained with MLM on the masked input; replacements for the masked slots are
sampled from its output, and the discriminator (the model one keeps) learns, for every real token
of the corrupted sequence, whether it was replaced. Both towers train in the one jitted step:

  mask (masking.py, as for MLM) -> generator -> MLM head on the prediction slots only (the sparse
  head of objectives.py) -> Gumbel-max sample per slot (no gradient through the sample) -> original
  ids with the masked slots replaced -> discriminator -> binary head on every position ->
  loss = generator MLM (mean over slots) + electra.disc_weight x discriminator BCE (mean over real tokens).

The pair (`ElectraPair`) holds `discriminator` (an Encoder without MLM head, whose config is
`config.model`), `generator` (an Encoder of `generator_config`) and `rtd_head`. Word, position and
token-type embeddings are the discriminator's nnx.Params, reused by the generator (one array in
the state, under `discriminator.`; its gradient sums both towers), as in the paper: with
`model.embedding_size` smaller than the hidden sizes, each tower projects them up with its own
`embeddings_project` and the generator's MLM head projects back down to the tied decoder. Each tower
keeps its own embedding LayerNorm (transformers' two models each carry one).

Sampling noise is a counter-based hash (model.dropout_bits) seeded per example from the step key, so
the replacements of example i depend only on (seed, step, i), never on the mesh or on gradient
accumulation, and a resumed run replays them exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from mlm_jax import masking, model as model_lib, objectives, schedules
from mlm_jax.errors import ConfigError


def discriminator_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.model` without an MLM head: the discriminator (what fine-tuning starts from)."""
  cfg = ml_collections.ConfigDict(config.model.to_dict())
  cfg.mlm_head = False
  return cfg


def generator_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The generator: `config.model` with the `electra.generator_*` sizes (0 = 1/4 of the discriminator's
  width, heads and FFN, and its depth), the same embedding size and an MLM head."""
  m, e = config.model, config.electra
  cfg = ml_collections.ConfigDict(m.to_dict())
  cfg.embedding_size = model_lib.embedding_size(m)
  cfg.hidden_size = int(e.generator_hidden_size or m.hidden_size // 4)
  cfg.num_heads = int(e.generator_num_heads or max(1, m.num_heads // 4))
  cfg.intermediate_size = int(e.generator_intermediate_size or m.intermediate_size // 4)
  cfg.num_layers = int(e.generator_num_layers or m.num_layers)
  cfg.mlm_head = True
  if cfg.hidden_size % cfg.num_heads:
    raise ConfigError(f"electra.generator_hidden_size={cfg.hidden_size} is not divisible by "
                      f"electra.generator_num_heads={cfg.num_heads}")
  return cfg


def check_config(config: ml_collections.ConfigDict) -> None:
  if config.electra.disc_weight < 0:
    raise ConfigError(f"electra.disc_weight={config.electra.disc_weight}: expected >= 0")
  generator_config(config)
  model_lib.embedding_size(config.model)


class RTDHead(nnx.Module):
  """Replaced-token detection: dense -> GELU -> dense to one logit per position (transformers'
  ElectraDiscriminatorPredictions)."""

  def __init__(self, cfg: ml_collections.ConfigDict, key, param_dtype):
    h, std = cfg.hidden_size, cfg.initializer_range
    kd, ko = jax.random.split(key)
    self.dense_kernel = model_lib._param(kd, (h, h), ("embed", None), "normal", std, param_dtype)
    self.dense_bias = model_lib._param(None, (h,), ("norm",), "zeros", 0.0, param_dtype)
    self.out_kernel = model_lib._param(ko, (h,), ("norm",), "normal", std, param_dtype)
    self.out_bias = model_lib._param(None, (), (), "zeros", 0.0, param_dtype)

  def __call__(self, hidden, dtype):
    y = model_lib.gelu(hidden @ self.dense_kernel[...].astype(dtype) + self.dense_bias[...].astype(dtype))
    z = jnp.einsum("...h,h->...", y, self.out_kernel[...].astype(dtype), preferred_element_type=jnp.float32)
    return z + self.out_bias[...].astype(jnp.float32)


class ElectraPair(nnx.Module):
  """Discriminator + generator sharing the token embeddings, + the replaced-token-detection head."""

  def __init__(self, config: ml_collections.ConfigDict, *, seed: int = 0):
    d_cfg = discriminator_config(config)
    self.discriminator = model_lib.Encoder(d_cfg, seed=seed)
    self.generator = model_lib.Encoder(generator_config(config), seed=seed + 7919,
                                       shared_embeddings=self.discriminator)
    self.rtd_head = RTDHead(d_cfg, jax.random.fold_in(jax.random.key(seed), 0x47D), jnp.dtype(d_cfg.param_dtype))


def abstract_pair(config: ml_collections.ConfigDict):
  """(graphdef, parameter shapes) of the pair, without allocating anything."""
  return nnx.split(nnx.eval_shape(lambda: ElectraPair(config, seed=config.seed)), nnx.Param)


def sample_slots(logits, seeds):
  """Gumbel-max samples [B, P] from float32 logits [B, P, V]; `seeds` [B, 2] uint32 key data per example."""
  b, p, v = logits.shape
  bits = jax.vmap(lambda k: model_lib.dropout_bits(jax.random.wrap_key_data(k), (p, v)))(seeds)
  u = ((bits >> 8).astype(jnp.float32) + 0.5) * (1.0 / (1 << 24))   # uniform in (0, 1)
  return jnp.argmax(logits - jnp.log(-jnp.log(u)), axis=-1).astype(jnp.int32)


def corrupt(original, positions, weights, sampled):
  """The original ids with the used slots replaced by `sampled`; and which tokens now differ.

  Built by comparison with each position rather than a scatter, so the unused slots (position 0,
  weight 0) can never overwrite a used one.
  """
  s = original.shape[1]
  hit = (positions[:, :, None] == jnp.arange(s)[None, None, :]) & (weights[:, :, None] > 0)   # [B, P, S]
  chosen = hit.any(axis=1)
  value = jnp.where(hit, sampled[:, :, None], 0).sum(axis=1)
  corrupted = jnp.where(chosen, value, original)
  return corrupted, corrupted != original


class Electra:
  """The ELECTRA objective for step.make_trainer (interface: see step.MLM).

  The gradient is divided by the global number of prediction slots (`count_key`); the
  discriminator's summed loss enters scaled by slots / real tokens of the batch, so the total is
  mean MLM + disc_weight x mean BCE exactly for the whole batch (with gradient accumulation, each
  microbatch's ratio stands in for the global one).
  """
  count_key = "num_predictions"

  def __init__(self, config: ml_collections.ConfigDict):
    self.masking, self.vocab_size = config.masking, config.model.vocab_size
    self.disc_weight = float(config.electra.disc_weight)

  def prepare(self, batch, key, step=None):
    """MLM's masking (at the scheduled mask rate for `step`, as step.MLM) plus per-example sampling seeds."""
    mask_key, sample_key = jax.random.split(key)
    rate = schedules.mask_rate(self.masking, step, traced=True) if step is not None else None
    out = masking.mask_batch(batch, mask_key, self.masking, self.vocab_size, rate=rate)
    rows = jnp.arange(batch["input_ids"].shape[0])
    out["original_ids"] = batch["input_ids"]
    out["sample_seeds"] = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(sample_key, i)))(rows)
    return out

  def forward(self, pair: ElectraPair, batch, dropout_key=None, activation_sharding=None):
    """Everything the loss needs, as a dict (also what the tests compare with transformers)."""
    gen, disc = pair.generator, pair.discriminator
    gen_key = disc_key = None
    if dropout_key is not None:
      gen_key, disc_key = jax.random.split(dropout_key)
    seg, pos, tt = batch["segment_ids"], batch["positions"], batch.get("token_type_ids")
    hidden = gen(batch["input_ids"], seg, pos, tt, dropout_key=gen_key, activation_sharding=activation_sharding)
    y = gen.mlm_transform(objectives.gather_slots(hidden, batch["masked_positions"]))
    mlm = objectives.mlm_sums(y, gen.word_embeddings[...], gen.decoder_bias[...], batch["masked_labels"],
                              batch["masked_weights"])
    # The sampling logits again, without gradient (the loss's custom VJP keeps its own).
    logits = jnp.einsum("bph,vh->bpv", jax.lax.stop_gradient(y),
                        jax.lax.stop_gradient(gen.word_embeddings[...]).astype(y.dtype),
                        preferred_element_type=jnp.float32)
    logits = logits + jax.lax.stop_gradient(gen.decoder_bias[...]).astype(jnp.float32)
    sampled = sample_slots(logits, batch["sample_seeds"])
    corrupted, replaced = corrupt(batch["original_ids"], batch["masked_positions"], batch["masked_weights"], sampled)
    real = (seg != 0).astype(jnp.float32)
    labels = replaced.astype(jnp.float32) * real
    hidden_d = disc(corrupted, seg, pos, tt, dropout_key=disc_key, activation_sharding=activation_sharding)
    disc_logits = pair.rtd_head(hidden_d, disc.dtype)
    bce = optax.sigmoid_binary_cross_entropy(disc_logits, labels)
    correct = ((disc_logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
    sums = dict(mlm, disc_loss_sum=(bce * real).sum(), disc_correct_sum=(correct * real).sum(), num_tokens=real.sum(),
                replaced_sum=labels.sum())
    return dict(sums=sums, sampled=sampled, corrupted=corrupted, labels=labels, disc_logits=disc_logits)

  def loss_sums(self, pair, batch, dropout_key, activation_sharding=None):
    sums = self.forward(pair, batch, dropout_key, activation_sharding)["sums"]
    ratio = jax.lax.stop_gradient(sums["num_predictions"] / jnp.maximum(sums["num_tokens"], 1.0))
    return sums["loss_sum"] + self.disc_weight * ratio * sums["disc_loss_sum"], sums

  def evaluate(self, pair, batch, key, activation_sharding=None):
    return self.loss_sums(pair, self.prepare(batch, key), None, activation_sharding)[1]

  def summarize(self, sums) -> dict:
    n = max(float(sums["num_predictions"]), 1.0)
    t = max(float(sums["num_tokens"]), 1.0)
    mlm_loss, disc_loss = float(sums["loss_sum"]) / n, float(sums["disc_loss_sum"]) / t
    return dict(loss=mlm_loss + self.disc_weight * disc_loss, mlm_loss=mlm_loss,
                accuracy=float(sums["correct_sum"]) / n, disc_loss=disc_loss,
                disc_accuracy=float(sums["disc_correct_sum"]) / t, replaced=float(sums["replaced_sum"]) / t)

  @staticmethod
  def console(m: dict) -> str:
    return (f"loss {m['loss']:.4f}  mlm {m['mlm_loss']:.4f} acc {m['accuracy']:.3f}  disc {m['disc_loss']:.4f} "
            f"acc {m['disc_accuracy']:.3f}  replaced {m['replaced']:.3f}")
