"""The encoder: BERT / RoBERTa / XLM-R (exact by default) and ModernBERT's switches in one Flax NNX module.

Converted Hugging Face weights give the same logits; every parameter carries logical axis names
(sharding.py maps them to the mesh); dropout takes an explicit key, so a step is a pure function of
(state, batch, key). Why: docs/design_notes.md#encoder.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
import ml_collections

from mlm_jax.model import attention, matmul
from mlm_jax.config import choices
from mlm_jax.config import step_values as step_values_lib
from mlm_jax.errors import ConfigError

# Structure switches added for ModernBERT. config.json files written before them lack them and mean
# these values (the models they describe had every bias and norm); workdir/migrate.py fills them in.
MODEL_FIELDS = dict(attention_bias=True, mlp_bias=True, norm_bias=True, head_bias=True,
                    first_layer_attention_norm=True)
# LTG-BERT / ELC-BERT / GPT-BERT switches (docs/model.md), off in older config.json files too.
LTG_FIELDS = dict(extra_norms=False, layer_weighting=False)
# Added with ELECTRA and the sentence objectives: older config.json files mean embeddings as wide as the
# hidden states, an MLM head and no sentence head.
HEAD_FIELDS = dict(embedding_size=0, mlm_head=True, sentence_head=False)


def no_hf_equivalent(cfg: ml_collections.ConfigDict) -> list[str]:
  """The switches on in `cfg` that no transformers class has (to_hf refuses such a model)."""
  return [k for k in LTG_FIELDS if cfg[k]]


def final_norm_name(cfg: ml_collections.ConfigDict) -> str | None:
  """The attribute of the LayerNorm after the last layer: pre-LN only.

  A pre-LN model without an embedding norm keeps it under the historic name `embeddings_norm`, so
  checkpoints of pre-LN runs written before `model.embedding_norm` existed load unchanged.
  """
  if cfg.norm != "pre":
    return None
  return "final_norm" if cfg.embedding_norm else "embeddings_norm"


def _param(key, shape, names, init: str, std: float, dtype) -> nnx.Param:
  if init == "normal":
    value = std * jax.random.normal(key, shape, dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = jnp.zeros(shape, dtype)
  with nnx.use_eager_sharding(False):
    return nnx.Param(value, out_sharding=names)


def _fmix32(h):
  """MurmurHash3's 32-bit finalizer: a cheap bijection with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def dropout_bits(key, shape):
  """Counter-based random bits: a hash of (element index, two seeds drawn from `key`).

  Cheaper than threefry on CPU (docs/design_notes.md#encoder), as good for dropout, fused into the
  consuming op by XLA, and, like threefry, the same bits on any sharding: the index comes from an
  iota that XLA partitions with the array. Like threefry's counter the index does not wrap: an
  array of 2^32 elements or more (attention dropout over a global [B, heads, S, S] batch) is indexed
  by two words (`index_words`), so no two of its elements share an index.
  """
  seeds = jax.random.bits(key, (2,), jnp.uint32)
  return bits_at(*index_words(shape), seeds)


def index_words(shape, at=None):
  """An element's index as two uint32 words (high, low): low is the row-major index within the
  trailing dimensions whose product stays below 2^32, high the index over the leading ones. Below
  2^32 elements high is 0 and low the flat index. `at`: one integer array of coordinates per
  dimension, instead of every element's (a test reads points of an array too large to build)."""
  shape = tuple(int(d) for d in shape)
  split, inner = len(shape), 1
  while split > 0 and inner * shape[split - 1] < 2**32:
    split, inner = split - 1, inner * shape[split - 1]
  if split > 0 and math.prod(shape[:split]) >= 2**32:
    raise ValueError(f"dropout over shape {shape}: more than 2^64 elements")
  if at is None:
    at = [jax.lax.broadcasted_iota(jnp.uint32, shape, d) for d in range(len(shape))]
  at = [jnp.asarray(a, jnp.uint32) for a in at]

  def flat(dims):
    index, stride = jnp.zeros(at[0].shape if at else (), jnp.uint32), 1
    for d in reversed(dims):
      index = index + at[d] * jnp.uint32(stride)
      stride *= shape[d]
    return index

  return flat(range(split)), flat(range(split, len(shape)))


def bits_at(high, low, seeds):
  """The dropout bits of elements at index words (high, low) under two uint32 seeds. An array of
  fewer than 2^32 elements (high = 0) gets the bits it had before the high word existed."""
  bits = _fmix32(low * jnp.uint32(0x9E3779B1) + seeds[0]) ^ seeds[1]
  high_seed = _fmix32(seeds[0] ^ seeds[1] ^ jnp.uint32(0x5BD1E995))
  return _fmix32(bits ^ jnp.where(high == 0, jnp.uint32(0), _fmix32(high * jnp.uint32(0x85EBCA77) + high_seed)))


def dropout(x, rate: float, key):
  """Inverted dropout; a no-op when `key` is None (evaluation) or the rate is 0."""
  if key is None or rate <= 0.0:
    return x
  keep = dropout_bits(key, x.shape) >= jnp.uint32(min(int(rate * 2.0**32), 2**32 - 1))
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


def gelu(x):
  """Exact (erf) GELU, as BERT defines it.

  Written with erf rather than jax.nn.gelu(approximate=False), which uses erfc: same values to
  1e-6 in float32, and XLA's CPU erf is the faster (docs/design_notes.md#encoder).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(1.0 / math.sqrt(2.0), x.dtype)))


class LayerNorm(nnx.Module):
  """LayerNorm computed in float32 whatever the compute dtype (bf16 variance is too coarse)."""

  def __init__(self, size: int, eps: float, param_dtype, bias: bool = True):
    self.eps = eps
    self.scale = _param(None, (size,), ("norm",), "ones", 0.0, param_dtype)
    self.bias = _param(None, (size,), ("norm",), "zeros", 0.0, param_dtype) if bias else None

  def __call__(self, x):
    dtype = x.dtype
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...].astype(jnp.float32)
    if self.bias is not None:
      y = y + self.bias[...].astype(jnp.float32)
    return y.astype(dtype)


def _norm(cfg: ml_collections.ConfigDict, param_dtype) -> LayerNorm:
  return LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, param_dtype, bias=cfg.norm_bias)


def _value(param):
  """A parameter's array, or None for a layer without it (model.attention_bias / mlp_bias / head_bias off)."""
  return None if param is None else param[...]


def rotary(x, positions, theta: float):
  """Rotary position embedding (RoFormer) on [batch, seq, heads, head_dim], half-split layout."""
  half = x.shape[-1] // 2
  freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[..., None] * freq            # [B, S, half]
  cos, sin = jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class Attention(nnx.Module):
  """Self-attention over a `window` (0 = global; else |i - j| <= window / 2, with rope_theta_local)."""

  def __init__(self, cfg: ml_collections.ConfigDict, key, param_dtype, window: int = 0):
    h, n = cfg.hidden_size, cfg.num_heads
    d = h // n
    std = cfg.initializer_range
    kq, kk, kv, ko = jax.random.split(key, 4)
    self.q_kernel = _param(kq, (h, n, d), ("embed", "heads", "kv"), "normal", std, param_dtype)
    self.k_kernel = _param(kk, (h, n, d), ("embed", "heads", "kv"), "normal", std, param_dtype)
    self.v_kernel = _param(kv, (h, n, d), ("embed", "heads", "kv"), "normal", std, param_dtype)
    self.o_kernel = _param(ko, (n, d, h), ("heads", "kv", "embed"), "normal", std, param_dtype)
    bias = lambda shape, names: _param(None, shape, names, "zeros", 0.0, param_dtype) if cfg.attention_bias else None
    self.q_bias = bias((n, d), ("heads", "kv"))
    self.k_bias = bias((n, d), ("heads", "kv"))
    self.v_bias = bias((n, d), ("heads", "kv"))
    self.o_bias = bias((h,), ("norm",))
    # LTG-BERT / NormFormer: a LayerNorm on the heads' output before the output projection
    self.out_norm = _norm(cfg, param_dtype) if cfg.extra_norms else None
    self.rotary = cfg.positions == "rotary"
    self.window = window
    self.rope_theta = cfg.rope_theta_local if window else cfg.rope_theta
    self.dropout_rate = cfg.attention_dropout
    self.matmul = cfg.matmul

  def __call__(self, x, ctx: attention.Context, positions, dtype, key):
    def proj(kernel, bias):
      return matmul.einsum("bsh,hnd->bsnd", x, kernel[...], dtype, self.matmul, _value(bias))

    q, k, v = proj(self.q_kernel, self.q_bias), proj(self.k_kernel, self.k_bias), proj(self.v_kernel, self.v_bias)
    if self.rotary:
      theta = self.rope_theta if ctx.rope_thetas is None else ctx.rope_thetas["local" if self.window else "global"]
      q, k = rotary(q, positions, theta), rotary(k, positions, theta)
    mode = matmul.effective(self.matmul, dtype)
    if (key is None or self.dropout_rate <= 0.0) and not (mode == "f32_out" and ctx.impl == "xla"):
      out = attention.fused(q, k, v, ctx, self.window)
    else:
      # jax.nn.dot_product_attention has no dropout on the probabilities, and its matmuls return the
      # compute dtype; BERT's recipe trains with dropout and f32_out needs float32 results, so these
      # spell attention out (layout: docs/design_notes.md#encoder).
      logits = matmul.einsum_f32("bqnd,bknd->bnqk", q, k, dtype, mode) / math.sqrt(q.shape[-1])
      logits = jnp.where(ctx.masks[self.window], logits, jnp.finfo(jnp.float32).min)
      probs = dropout(jax.nn.softmax(logits, axis=-1), self.dropout_rate, key).astype(dtype)
      out = matmul.einsum("bnqk,bknd->bqnd", probs, v, dtype, mode)
    if self.out_norm is not None:
      b, s, n, d = out.shape
      out = self.out_norm(out.reshape(b, s, n * d)).reshape(b, s, n, d)
    return matmul.einsum("bsnd,ndh->bsh", out, self.o_kernel[...], dtype, self.matmul, _value(self.o_bias))


class MLP(nnx.Module):
  """gelu: wo(GELU(wi x)); geglu: wo(GELU(wi x) * wg x), HF ModernBERT's Wi = [wi; wg] (input, gate).
  `model.extra_norms`: wo(LN(...)), a LayerNorm on the hidden activation (LTG-BERT / NormFormer)."""

  def __init__(self, cfg: ml_collections.ConfigDict, key, param_dtype):
    h, f, std = cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range
    ki, kg, ko = jax.random.split(key, 3)
    self.gated = cfg.mlp == "geglu"
    bias = lambda size, names: _param(None, (size,), names, "zeros", 0.0, param_dtype) if cfg.mlp_bias else None
    self.wi_kernel = _param(ki, (h, f), ("embed", "mlp"), "normal", std, param_dtype)
    self.wi_bias = bias(f, ("mlp",))
    if self.gated:
      self.wg_kernel = _param(kg, (h, f), ("embed", "mlp"), "normal", std, param_dtype)
      self.wg_bias = bias(f, ("mlp",))
    self.wo_kernel = _param(ko, (f, h), ("mlp", "embed"), "normal", std, param_dtype)
    self.wo_bias = bias(h, ("norm",))
    self.matmul = cfg.matmul
    self.hidden_norm = (LayerNorm(f, cfg.layer_norm_eps, param_dtype, bias=cfg.norm_bias)
                        if cfg.extra_norms else None)

  def __call__(self, x, dtype):
    dense = lambda x, kernel, bias: matmul.einsum("bsi,io->bso", x, kernel[...], dtype, self.matmul, _value(bias))
    y = gelu(dense(x, self.wi_kernel, self.wi_bias))
    if self.gated:
      y = y * dense(x, self.wg_kernel, self.wg_bias)
    if self.hidden_norm is not None:
      y = self.hidden_norm(y)
    return dense(y, self.wo_kernel, self.wo_bias)


class Layer(nnx.Module):
  """One Transformer block; `norm='post'` is BERT's x = LN(x + f(x)), `pre` is x = x + f(LN(x)).

  `attention_norm=False` (pre-LN only; ModernBERT's layer 0) feeds the attention x itself.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, key, param_dtype, window: int = 0, attention_norm: bool = True):
    ka, km = jax.random.split(key)
    self.attention = Attention(cfg, ka, param_dtype, window)
    self.attention_norm = _norm(cfg, param_dtype) if attention_norm else None
    self.mlp = MLP(cfg, km, param_dtype)
    self.mlp_norm = _norm(cfg, param_dtype)
    self.pre_norm = cfg.norm == "pre"
    self.dropout_rate = cfg.hidden_dropout

  def __call__(self, x, ctx, positions, dtype, key):
    keys = [None] * 4 if key is None else list(jax.random.split(key, 4))
    if self.pre_norm:
      normed = x if self.attention_norm is None else self.attention_norm(x)
      x = x + dropout(self.attention(normed, ctx, positions, dtype, keys[0]), self.dropout_rate, keys[1])
      return x + dropout(self.mlp(self.mlp_norm(x), dtype), self.dropout_rate, keys[2])
    x = self.attention_norm(
        x + dropout(self.attention(x, ctx, positions, dtype, keys[0]), self.dropout_rate, keys[1]))
    return self.mlp_norm(x + dropout(self.mlp(x, dtype), self.dropout_rate, keys[2]))


def make_layer(cfg: ml_collections.ConfigDict, i: int, key, param_dtype) -> Layer:
  """Layer i: its attention window and, for ModernBERT's layer 0, no attention norm."""
  first_norm = i > 0 or cfg.first_layer_attention_norm
  return Layer(cfg, key, param_dtype, attention.layer_window(cfg, i), attention_norm=first_norm)


class LayerGroup(nnx.Module):
  """`attention.group_size(cfg)` consecutive layers from layer `first` on: one scan step.

  Every group has the same windows in the same order, since a layer's window depends on its index
  modulo the group size only, and `first` (scan_layout.lead_layers) is the first layer after those
  whose parameters differ from the rest (ModernBERT's layer 0 has no attention norm).
  """

  def __init__(self, cfg: ml_collections.ConfigDict, keys, param_dtype, first: int = 0):
    self.layers = nnx.List([make_layer(cfg, first + j, keys[j], param_dtype)
                            for j in range(attention.group_size(cfg))])

  def __call__(self, x, ctx, positions, dtype, keys, pin):
    for j, layer in enumerate(self.layers):
      x = pin(layer(x, ctx, positions, dtype, None if keys is None else keys[j]))
    return x


def embedding_size(cfg: ml_collections.ConfigDict) -> int:
  """Width of the token embeddings: `model.embedding_size`, 0 = hidden_size.

  ELECTRA makes it smaller than hidden_size (and shares the tables between its generator and
  discriminator); an `embeddings_project` layer then maps the normalized embeddings up to hidden_size,
  and the MLM head maps back down to it. Only post-LN models have this option (transformers' ELECTRA).
  """
  e = int(cfg.embedding_size)
  if e and e != cfg.hidden_size and cfg.norm != "post":
    raise ConfigError(f"model.embedding_size={e} differs from model.hidden_size={cfg.hidden_size}: only "
                      "model.norm='post' models project their embeddings (ELECTRA)")
  return e or cfg.hidden_size


def layer_layout(cfg: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """(lead layers a, groups n, layers per group g) of the scanned model of `cfg` (mlm_jax/model/scan_layout.py)."""
  g = attention.group_size(cfg)
  lead = 0 if cfg.first_layer_attention_norm else min(1, cfg.num_layers)
  return lead, (cfg.num_layers - lead) // g, g


def abstract_model(model_cfg: ml_collections.ConfigDict):
  """The encoder's (graphdef, parameter shapes), without allocating anything."""
  return nnx.split(nnx.eval_shape(lambda: Encoder(model_cfg)), nnx.Param)


def _remat_policy(remat: str):
  return (jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims if remat == "dots"
          else jax.checkpoint_policies.nothing_saveable)


class Encoder(nnx.Module):
  """Embeddings -> layers -> (final norm for pre-LN) -> MLM head with the decoder tied to the embeddings.

  `__call__` returns hidden states; the MLM head is applied separately (`mlm_logits`) so the
  training step can run it on the gathered prediction slots only.

  `model.embedding_size` (ELECTRA) makes the embeddings narrower than the layers, with an
  `embeddings_project` up to hidden_size and the MLM head back down to it; `model.mlm_head=False`
  leaves the head out (ELECTRA's discriminator, and models fine-tuned from it).

  With `scan_layers`, the layers are stacked in groups of `attention.group_size(cfg)` (a leading
  `layers` axis, `layer_groups`) run by one lax.scan; layers before the groups whose parameters
  differ from the rest (`lead_layers`: ModernBERT's layer 0, which has no attention norm) and the
  ones after the last whole group (`tail_layers`) are unrolled; mlm_jax/model/scan_layout.py converts
  between the two layouts.
  """

  def __init__(self, cfg: ml_collections.ConfigDict, *, seed: int = 0, shared_embeddings: "Encoder | None" = None,
               share_embedding_norm: bool = False):
    """`model.mlm_head=False` builds no MLM head (ELECTRA's discriminator); `shared_embeddings` reuses another
    encoder's word / position / token-type tables (the same nnx.Param objects: one array in the state,
    gradients from both users summed), as ELECTRA's generator shares the discriminator's, and with
    `share_embedding_norm` its embedding LayerNorm too."""
    if cfg.hidden_size % cfg.num_heads:
      raise ConfigError(f"model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}")
    for field in ("positions", "norm", "mlp"):
      choices.check(f"model.{field}", cfg[field])
    attention.validate_model_config(cfg)
    if not cfg.first_layer_attention_norm and cfg.norm != "pre":
      raise ConfigError("model.first_layer_attention_norm=False needs model.norm='pre' (a post-LN layer's "
                        "attention norm is its residual LayerNorm)")
    if cfg.layer_weighting and cfg.scan_layers:
      raise ConfigError("model.layer_weighting=True needs model.scan_layers=False (each layer reads a weighted "
                        "sum of every earlier layer's output)")
    self.cfg = cfg
    pdt = jnp.dtype(cfg.param_dtype)
    h, std = cfg.hidden_size, cfg.initializer_range
    e = embedding_size(cfg)
    keys = jax.random.split(jax.random.key(seed), cfg.num_layers + 6)
    if shared_embeddings is not None:
      self.word_embeddings = shared_embeddings.word_embeddings
    else:
      self.word_embeddings = _param(keys[0], (cfg.vocab_size, e), ("vocab", "embed"), "normal", std, pdt)
    if cfg.positions == "learned":
      self.position_embeddings = (shared_embeddings.position_embeddings if shared_embeddings is not None else
                                  _param(keys[1], (cfg.max_position_embeddings, e), ("positions", "embed"),
                                         "normal", std, pdt))
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = (shared_embeddings.token_type_embeddings if shared_embeddings is not None else
                                    _param(keys[2], (cfg.type_vocab_size, e), (None, "embed"), "normal", std, pdt))
    if cfg.embedding_norm:   # on the embedding sum, before any projection: of the embedding size
      self.embeddings_norm = (shared_embeddings.embeddings_norm if share_embedding_norm and shared_embeddings
                              else LayerNorm(e, cfg.layer_norm_eps, pdt, bias=cfg.norm_bias))
    if final_norm_name(cfg):
      setattr(self, final_norm_name(cfg), _norm(cfg, pdt))
    if e != h:
      # ELECTRA: embeddings narrower than the layers, projected up after their LayerNorm.
      kp = jax.random.fold_in(keys[5], 1)
      self.embeddings_project_kernel = _param(kp, (e, h), ("embed", None), "normal", std, pdt)
      self.embeddings_project_bias = _param(None, (h,), ("norm",), "zeros", 0.0, pdt)
    layer_keys = keys[6:]
    if cfg.scan_layers:
      lead, n, g = layer_layout(cfg)
      self.lead_layers = nnx.List([make_layer(cfg, i, layer_keys[i], pdt) for i in range(lead)])
      make = nnx.vmap(lambda k: LayerGroup(cfg, k, pdt, lead), transform_metadata={nnx.PARTITION_NAME: "layers"})
      self.layer_groups = make(layer_keys[lead:lead + n * g].reshape(n, g)) if n else None
      self.tail_layers = nnx.List([make_layer(cfg, i, layer_keys[i], pdt) for i in range(lead + n * g, cfg.num_layers)])
    else:
      self.layers = nnx.List([make_layer(cfg, i, layer_keys[i], pdt) for i in range(cfg.num_layers)])
    if cfg.layer_weighting:
      # ELC-BERT: row l weighs the embeddings and the outputs of layers 1..l+1 into what follows layer l+1;
      # one-hot on layer l+1's own output at init (a plain residual stack), entries past it unused.
      n = cfg.num_layers
      with nnx.use_eager_sharding(False):
        self.layer_weights = nnx.Param(jnp.eye(n, n + 1, k=1, dtype=pdt), out_sharding=(None, None))
    if cfg.mlm_head:   # projects back to the embedding size, where the tied decoder is
      self.head_kernel = _param(keys[3], (h, e), ("embed", None), "normal", std, pdt)
      self.head_bias = _param(None, (e,), ("norm",), "zeros", 0.0, pdt) if cfg.head_bias else None
      self.head_norm = LayerNorm(e, cfg.layer_norm_eps, pdt, bias=cfg.norm_bias)
      self.decoder_bias = _param(None, (cfg.vocab_size,), ("vocab",), "zeros", 0.0, pdt)
    if cfg.use_pooler:
      self.pooler_kernel = _param(keys[4], (h, h), ("embed", None), "normal", std, pdt)
      self.pooler_bias = _param(None, (h,), ("norm",), "zeros", 0.0, pdt)
    if cfg.sentence_head:   # NSP / SOP: two classes on the pooled first token
      if not cfg.use_pooler:
        raise ConfigError("model.sentence_head needs model.use_pooler=True (the head reads the pooled output)")
      self.sentence_kernel = _param(keys[5], (h, 2), ("embed", None), "normal", std, pdt)
      self.sentence_bias = _param(None, (2,), (None,), "zeros", 0.0, pdt)

  @property
  def dtype(self):
    return jnp.dtype(self.cfg.dtype)

  @property
  def matmul_mode(self) -> str:
    """model.matmul (mlm_jax/model/matmul.py)."""
    return self.cfg.matmul

  def __call__(self, input_ids, segment_ids, positions, token_type_ids=None, *, dropout_key=None,
               activation_sharding=None, causal=None, step_values: step_values_lib.StepValues | None = None):
    """`activation_sharding` pins the [batch, seq, hidden] activations between layers (the train step
    passes batch over ("data", "fsdp")): with fsdp-sharded weights XLA's propagation otherwise follows
    the weights' `embed` sharding and replicates the batch, i.e. every chip computes the global batch.
    `causal` ([batch] bool): rows whose tokens attend only to themselves and earlier tokens (GPT-BERT).
    `step_values`: the trainer's step passes its RoPE thetas (config/step_values.py); None: the config's.
    """
    cfg, dtype = self.cfg, self.dtype
    pin = (lambda y: y) if activation_sharding is None else (
        lambda y: jax.lax.with_sharding_constraint(y, activation_sharding))
    x = jnp.take(self.word_embeddings[...], input_ids, axis=0)
    if cfg.positions == "learned":
      x = x + jnp.take(self.position_embeddings[...], positions + cfg.position_offset, axis=0)
    if cfg.type_vocab_size > 0:
      tt = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
      x = x + jnp.take(self.token_type_embeddings[...], tt, axis=0)
    x = x.astype(dtype)
    keys = [None] * (cfg.num_layers + 1) if dropout_key is None else list(
        jax.random.split(dropout_key, cfg.num_layers + 1))
    if cfg.embedding_norm:
      x = self.embeddings_norm(x)
    if embedding_size(cfg) != cfg.hidden_size:
      x = x @ self.embeddings_project_kernel[...].astype(dtype) + self.embeddings_project_bias[...].astype(dtype)
    x = pin(dropout(x, cfg.hidden_dropout, keys[0]))
    mesh = None if activation_sharding is None else activation_sharding.mesh
    ctx = attention.make_context(cfg, segment_ids, mesh, training=dropout_key is not None,
                                 rope_thetas=step_values_lib.rope_thetas(step_values, cfg), causal=causal)
    layer_fn = Layer.__call__
    if cfg.remat != "none":
      layer_fn = nnx.remat(Layer.__call__, static_argnums=(4,), policy=_remat_policy(cfg.remat))
    layer_keys = keys[1:]
    if cfg.scan_layers:
      lead, n, g = layer_layout(cfg)
      for layer, key in zip(self.lead_layers, layer_keys[:lead]):
        x = pin(layer_fn(layer, x, ctx, positions, dtype, key))
      x = self._scan(x, ctx, positions, layer_keys[lead:lead + n * g], pin)
      rest = zip(self.tail_layers, layer_keys[lead + n * g:])
    else:
      rest = zip(self.layers, layer_keys)
    outputs = [x]   # layer_weighting: the embeddings, then every layer's output
    for i, (layer, key) in enumerate(rest):
      x = pin(layer_fn(layer, x, ctx, positions, dtype, key))
      if cfg.layer_weighting:
        outputs.append(x)
        w = self.layer_weights[...][i, :i + 2].astype(dtype)
        x = pin(sum(w[j] * h for j, h in enumerate(outputs)))
    if final_norm_name(cfg):
      x = getattr(self, final_norm_name(cfg))(x)
    return x

  def _scan(self, x, ctx, positions, keys, pin):
    """The stacked groups in one lax.scan (remat'ed per group); keys are their layers' dropout keys."""
    if self.layer_groups is None:
      return x
    graphdef, params = nnx.split(self.layer_groups)
    n, g = jax.tree.leaves(params)[0].shape[0], attention.group_size(self.cfg)
    dtype = self.dtype

    def body(x, xs):
      p, k = xs
      return nnx.merge(graphdef, p)(x, ctx, positions, dtype, k, pin), None

    if self.cfg.remat != "none":
      body = jax.checkpoint(body, policy=_remat_policy(self.cfg.remat), prevent_cse=False)
    group_keys = None if keys[0] is None else jnp.stack(keys).reshape(n, g)
    x, _ = jax.lax.scan(body, x, (params, group_keys))
    return x

  def mlm_transform(self, hidden):
    """The MLM head before the vocabulary projection: dense -> GELU -> LayerNorm (BERT and ModernBERT)."""
    dtype, kernel = self.dtype, self.head_kernel[...]
    y = matmul.einsum("ni,io->no", hidden.reshape(-1, hidden.shape[-1]), kernel, dtype, self.matmul_mode,
                      _value(self.head_bias))
    y = gelu(y.reshape(*hidden.shape[:-1], kernel.shape[-1]))
    return self.head_norm(y)

  def mlm_logits(self, hidden):
    """MLM head on any [..., hidden] array; float32 logits over the vocabulary (decoder tied to the embeddings)."""
    y = self.mlm_transform(hidden)
    logits = jnp.einsum("...h,vh->...v", y, self.word_embeddings[...].astype(self.dtype),
                        preferred_element_type=jnp.float32)
    return logits + self.decoder_bias[...].astype(jnp.float32)

  def pool(self, hidden):
    """BERT pooler: tanh(dense(first token)); the sentence representation for classification."""
    if not self.cfg.use_pooler:
      raise ConfigError("model.use_pooler is False: this model has no pooler")
    first = hidden[:, 0]
    return jnp.tanh(first @ self.pooler_kernel[...].astype(self.dtype) + self.pooler_bias[...].astype(self.dtype))

  def sentence_logits(self, hidden):
    """[B, 2] float32 logits of the sentence head (BERT's seq_relationship) on the pooled output."""
    pooled = self.pool(hidden)
    return (pooled @ self.sentence_kernel[...].astype(self.dtype)).astype(jnp.float32) + \
        self.sentence_bias[...].astype(jnp.float32)
