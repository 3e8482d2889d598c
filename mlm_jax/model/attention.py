"""Attention kernels (xla, Pallas splash on TPU, cuDNN on GPU) and local/global layers.

`model.attention_impl='auto'` picks per the mesh's platform, not the host's (the AOT tool compiles TPU programs
on a CPU host), and xla when attention dropout is on: only xla has it (docs/design_notes.md#attention).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P
import ml_collections

from mlm_jax.config import choices
from mlm_jax.errors import ConfigError

IMPLS = choices.CHOICES["model.attention_impl"]
SPLASH_BLOCKS = (512, 256, 128)   # the largest that divides the sequence is used
# Fields added with these options; config.json files of older runs lack them and mean these values
# (workdir/migrate.py fills them in).
NEW_FIELDS = dict(attention_impl="auto", global_attention_every=0, local_window=128, rope_theta_local=10000.0,
                  scan_layers=False)


def is_global(cfg: ml_collections.ConfigDict, layer: int) -> bool:
  every = int(cfg.get("global_attention_every", 0))
  return every <= 1 or layer % every == 0


def layer_window(cfg: ml_collections.ConfigDict, layer: int) -> int:
  """Window (tokens, HF meaning) of a layer; 0 = global."""
  return 0 if is_global(cfg, layer) else int(cfg.local_window)


def group_size(cfg: ml_collections.ConfigDict) -> int:
  """Layers in one scanned step: one global layer and the local layers up to the next global one."""
  return max(1, int(cfg.get("global_attention_every", 0)))


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """One-line errors, naming the field, for the attention / scan fields of `config.model`."""
  choices.check("model.attention_impl", cfg.attention_impl)
  if int(cfg.global_attention_every) < 0:
    raise ConfigError(f"model.global_attention_every={cfg.global_attention_every}: expected >= 0 (0 = all global)")
  if int(cfg.global_attention_every) > 1 and (cfg.local_window <= 0 or cfg.local_window % 2):
    raise ConfigError(f"model.local_window={cfg.local_window}: expected a positive even number of tokens "
                     f"(local layers see |i - j| <= local_window / 2)")
  choices.check("model.remat", cfg.remat)
  if not isinstance(cfg.scan_layers, bool):
    raise ConfigError(f"model.scan_layers={cfg.scan_layers!r}: expected True or False")


def _splash_problem(cfg, platform: str, seq_len: int) -> str:
  if cfg.attention_dropout > 0:
    return f"has no attention dropout (model.attention_dropout={cfg.attention_dropout}; set it to 0)"
  if seq_len % 128:
    return f"needs data.seq_len a multiple of 128 (got {seq_len})"
  if platform not in ("tpu", "cpu"):
    return f"runs on TPU (or in interpret mode on CPU), not on {platform}"
  return ""


def _cudnn_problem(cfg, platform: str, packed_documents: bool) -> str:
  head_dim = cfg.hidden_size // cfg.num_heads
  if cfg.attention_dropout > 0:
    return f"has no attention dropout here (model.attention_dropout={cfg.attention_dropout}; set it to 0)"
  if platform != "gpu":
    return f"runs on GPU only, not on {platform}"
  if packed_documents:
    return "serves padding-only batches; packed documents (data.packing='segmented') need xla or splash"
  if int(cfg.global_attention_every) > 1:
    return f"has no bidirectional local window (model.global_attention_every={cfg.global_attention_every})"
  if cfg.dtype not in ("bfloat16", "float16"):
    return f"needs model.dtype bfloat16 or float16 (got {cfg.dtype})"
  if head_dim % 8 or head_dim > 128:
    return f"needs a head size that is a multiple of 8 up to 128 (hidden_size / num_heads = {head_dim})"
  return ""


def resolve_impl(cfg: ml_collections.ConfigDict, platform: str, seq_len: int,
                 packed_documents: bool = True) -> tuple[str, str]:
  """(implementation, why) for `config.model` on `platform` ('tpu', 'gpu', 'cpu').

  `packed_documents`: whether a row may hold several documents (data.packing == 'segmented').
  An explicit splash / cudnn that cannot serve the config raises a one-line ValueError; `auto`
  falls back to xla and says why, for the log.
  """
  validate_model_config(cfg)
  requested = cfg.attention_impl
  problem = {"splash": lambda: _splash_problem(cfg, platform, seq_len),
             "cudnn": lambda: _cudnn_problem(cfg, platform, packed_documents)}
  if requested == "xla":
    return "xla", "model.attention_impl=xla"
  if requested in problem:
    why = problem[requested]()
    if why:
      raise ConfigError(f"model.attention_impl={requested}: {requested} {why}")
    mode = " (Pallas interpret mode: slow, for tests)" if requested == "splash" and platform == "cpu" else ""
    return requested, f"model.attention_impl={requested}{mode}"
  want = {"tpu": "splash", "gpu": "cudnn"}.get(platform)
  if want is None:
    return "xla", f"auto on {platform}: xla"
  why = problem[want]()
  if why:
    return "xla", f"auto on {platform}: xla, since {want} {why}"
  return want, f"auto on {platform}: {want}"


def platform_of(mesh) -> str:
  return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


@struct.dataclass
class Context:
  """What every layer's attention needs, built once per forward pass.

  `masks` maps a window (0 = global) to its dense [B, 1, S, S] mask; only the xla path has any.
  `rope_thetas`: {"global", "local"} RoPE thetas as values of the step (config/step_values.py), or None:
  each layer's config constant.
  """
  segment_ids: jax.Array
  masks: dict
  impl: str = struct.field(pytree_node=False)
  mesh: Any = struct.field(pytree_node=False, default=None)
  rope_thetas: Any = None


def dense_mask(segment_ids, window: int = 0, causal=None):
  """[B, 1, S, S] boolean: a token sees its own document (within `window` / 2); padding (0) sees nothing.
  `causal` ([B] bool, or None = no row): in those rows a token sees only itself and what precedes it."""
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  mask = same & (segment_ids[:, None, :] > 0)
  idx = jnp.arange(segment_ids.shape[1])
  if window:
    mask = mask & (jnp.abs(idx[:, None] - idx[None, :]) <= window // 2)
  if causal is not None:
    mask = mask & (~causal[:, None, None] | (idx[None, :] <= idx[:, None])[None])
  return mask[:, None]


def make_context(cfg: ml_collections.ConfigDict, segment_ids, mesh=None, training: bool = False,
                 rope_thetas=None, causal=None) -> Context:
  """The resolved implementation (an `auto` still in the config is resolved here) and its masks;
  `causal` ([B] bool): rows that attend causally (GPT-BERT's causal share), which only xla serves."""
  impl = cfg.attention_impl
  if impl == "auto":
    impl = "xla" if causal is not None else resolve_impl(cfg, platform_of(mesh), segment_ids.shape[1])[0]
  if causal is not None and impl != "xla":
    raise ConfigError(f"model.attention_impl={impl} has no causal rows (a causal objective's batches): use xla")
  if training and cfg.attention_dropout > 0 and impl != "xla":
    raise ConfigError(f"model.attention_impl={impl} has no attention dropout "
                     f"(model.attention_dropout={cfg.attention_dropout}): use xla or set the dropout to 0")
  masks = {}
  if impl == "xla":
    windows = {layer_window(cfg, i) for i in range(cfg.num_layers)}
    masks = {w: dense_mask(segment_ids, w, causal) for w in sorted(windows)}
  return Context(segment_ids=segment_ids, masks=masks, impl=impl, mesh=mesh, rope_thetas=rope_thetas)


def fused(q, k, v, ctx: Context, window: int):
  """Attention without dropout through ctx.impl; q, k, v and the result are [B, S, N, D]."""
  if ctx.impl == "xla":
    return jax.nn.dot_product_attention(q, k, v, mask=ctx.masks[window], implementation="xla")
  if ctx.impl == "cudnn":
    return cudnn_attention(q, k, v, ctx.segment_ids)
  if ctx.impl == "splash":
    return splash_attention(q, k, v, ctx.segment_ids, window, ctx.mesh)
  raise ConfigError(f"model.attention_impl={ctx.impl!r}: expected one of {IMPLS}")


def cudnn_attention(q, k, v, segment_ids, implementation: str = "cudnn"):
  """Padding-only rows: real tokens first, their count from segment_ids (0 = padding).

  `implementation='xla'` gives the same semantics on any host (the tests use it).
  """
  lengths = (segment_ids > 0).sum(-1).astype(jnp.int32)
  return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                                      implementation=implementation)


@functools.lru_cache(maxsize=64)
def _splash_kernel(seq_len: int, heads: int, window: int, interpret: bool):
  """A splash kernel for [heads, seq, head_dim] inputs; its block-sparsity tables are built once."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  shape = (seq_len, seq_len)
  one = sm.LocalMask(shape, (window // 2, window // 2), 0) if window else sm.FullMask(shape)
  block = next(b for b in SPLASH_BLOCKS if seq_len % b == 0)
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return sk.make_splash_mha(sm.MultiHeadMask([one] * heads), block_sizes=sizes, head_shards=1,
                            q_seq_shards=1, interpret=interpret)


def splash_attention(q, k, v, segment_ids, window: int = 0, mesh=None):
  """Pallas splash attention on [B, S, N, D]; rows with segment id 0 (padding) see only padding.

  With a mesh, each device runs the kernel on its batch rows and heads (shard_map over the
  ("data", "fsdp") and "tensor" axes); without one, on the whole array.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds
  from mlm_jax.model.sharding import BATCH_AXES
  interpret = platform_of(mesh) != "tpu"
  q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)   # the kernel does not scale

  def local(q, k, v, seg):
    kernel = _splash_kernel(q.shape[2], q.shape[1], window, interpret)
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=SegmentIds(s, s)))(q, k, v, seg)

  heads_first = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]
  if mesh is None:
    out = local(*heads_first, segment_ids)
  else:
    heads_axis = "tensor" if q.shape[2] % mesh.shape["tensor"] == 0 else None
    spec = P(BATCH_AXES, heads_axis, None, None)
    out = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P(BATCH_AXES, None)), out_specs=spec,
                        check_vma=False)(*heads_first, segment_ids)
  return out.transpose(0, 2, 1, 3)

