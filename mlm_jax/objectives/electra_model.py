"""ELECTRA's model: the generator + discriminator pair (`ElectraPair`) and the replaced-token sampling.

The towers share the discriminator's embeddings (and by default its embedding LayerNorm); sampling
noise depends only on (seed, step, example), never on the mesh, so a resumed run replays it.
Layout and reasons: docs/design_notes.md#electra-electra_model.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from mlm_jax.model import encoder
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
  cfg.embedding_size = encoder.embedding_size(m)
  cfg.hidden_size = int(e.generator_hidden_size or m.hidden_size // 4)
  cfg.num_heads = int(e.generator_num_heads or max(1, m.num_heads // 4))
  cfg.intermediate_size = int(e.generator_intermediate_size or m.intermediate_size // 4)
  cfg.num_layers = int(e.generator_num_layers or m.num_layers)
  cfg.mlm_head = True
  if cfg.hidden_size % cfg.num_heads:
    raise ConfigError(f"electra.generator_hidden_size={cfg.hidden_size} is not divisible by "
                      f"electra.generator_num_heads={cfg.num_heads}")
  return cfg


class RTDHead(nnx.Module):
  """Replaced-token detection: dense -> GELU -> dense to one logit per position (transformers'
  ElectraDiscriminatorPredictions)."""

  def __init__(self, cfg: ml_collections.ConfigDict, key, param_dtype):
    h, std = cfg.hidden_size, cfg.initializer_range
    kd, ko = jax.random.split(key)
    self.dense_kernel = encoder._param(kd, (h, h), ("embed", None), "normal", std, param_dtype)
    self.dense_bias = encoder._param(None, (h,), ("norm",), "zeros", 0.0, param_dtype)
    self.out_kernel = encoder._param(ko, (h,), ("norm",), "normal", std, param_dtype)
    self.out_bias = encoder._param(None, (), (), "zeros", 0.0, param_dtype)

  def __call__(self, hidden, dtype):
    y = encoder.gelu(hidden @ self.dense_kernel[...].astype(dtype) + self.dense_bias[...].astype(dtype))
    z = jnp.einsum("...h,h->...", y, self.out_kernel[...].astype(dtype), preferred_element_type=jnp.float32)
    return z + self.out_bias[...].astype(jnp.float32)


class ElectraPair(nnx.Module):
  """Discriminator + generator sharing the token embeddings, + the replaced-token-detection head."""

  def __init__(self, config: ml_collections.ConfigDict, *, seed: int = 0):
    d_cfg = discriminator_config(config)
    self.discriminator = encoder.Encoder(d_cfg, seed=seed)
    self.generator = encoder.Encoder(generator_config(config), seed=seed + 7919,
                                       shared_embeddings=self.discriminator,
                                       share_embedding_norm=bool(config.electra.get("share_embedding_norm", False)))
    self.rtd_head = RTDHead(d_cfg, jax.random.fold_in(jax.random.key(seed), 0x47D), jnp.dtype(d_cfg.param_dtype))


def abstract_pair(config: ml_collections.ConfigDict):
  """(graphdef, parameter shapes) of the pair, without allocating anything."""
  return nnx.split(nnx.eval_shape(lambda: ElectraPair(config, seed=config.seed)), nnx.Param)


def sample_slots(logits, seeds):
  """Gumbel-max samples [B, P] from float32 logits [B, P, V]; `seeds` [B, 2] uint32 key data per example."""
  b, p, v = logits.shape
  bits = jax.vmap(lambda k: encoder.dropout_bits(jax.random.wrap_key_data(k), (p, v)))(seeds)
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
