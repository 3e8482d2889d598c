"""ModernBERT (transformers' ModernBertForMaskedLM) <-> our Encoder: the config and every tensor.

ModernBERT is our pre-LN encoder with its switches set; its fused `attn.Wqkv` and `mlp.Wi` are split on
import and joined on export, so HF -> ours -> HF is exact, and both config.json spellings (transformers
< 5 and >= 5) are read and written. Details: docs/design_notes.md#modernbert.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import ml_collections

from mlm_jax.errors import ConversionError

ARCH = "modernbert"
DEFAULT_THETA = dict(full_attention=160_000.0, sliding_attention=10_000.0)   # transformers' defaults


def is_modernbert(cfg: ml_collections.ConfigDict) -> bool:
  """Whether `config.model` has ModernBERT's structure (what `to_hf` can write as one)."""
  return (cfg.norm == "pre" and cfg.positions == "rotary" and cfg.mlp == "geglu" and cfg.type_vocab_size == 0
          and cfg.embedding_norm and not cfg.first_layer_attention_norm)


def _global_every(hf: Mapping, num_layers: int) -> int:
  """Our global_attention_every from `layer_types` (or the older global_attn_every_n_layers)."""
  types = hf.get("layer_types")
  if not types:
    return int(hf.get("global_attn_every_n_layers", 3))
  if len(types) != num_layers or set(types) - {"full_attention", "sliding_attention"}:
    raise ConversionError(f"HF layer_types={types}: expected {num_layers} of 'full_attention' / 'sliding_attention'")
  full = [i for i, t in enumerate(types) if t == "full_attention"]
  every = full[1] if len(full) > 1 else num_layers
  if len(full) == num_layers:
    every = 1
  if [i % every == 0 for i in range(num_layers)] != [t == "full_attention" for t in types]:
    raise ConversionError(f"HF layer_types={types}: not a global layer every N layers from layer 0")
  return every


def _theta(hf: Mapping, kind: str, older_key: str) -> float:
  rope = (hf.get("rope_parameters") or {}).get(kind) or {}
  if rope.get("rope_type", "default") != "default":
    raise ConversionError(f"HF rope_parameters[{kind!r}].rope_type={rope['rope_type']!r}: only 'default' is supported")
  return float(rope.get("rope_theta", hf.get(older_key, DEFAULT_THETA[kind])))


def model_config_from_hf(hf: Mapping, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Our `config.model` for a ModernBERT config.json dict; `base` supplies the non-HF fields."""
  for key in ("hidden_activation", "classifier_activation"):
    if hf.get(key, "gelu") != "gelu":
      raise ConversionError(f"HF {key}={hf[key]!r}: only exact 'gelu' is supported")
  if not hf.get("decoder_bias", True):
    raise ConversionError("HF decoder_bias=False: our MLM decoder always has a bias")
  if not hf.get("tie_word_embeddings", True):
    raise ConversionError("HF tie_word_embeddings=False: our MLM decoder is tied to the word embeddings")
  hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  if hf.get("head_dim") not in (None, hidden // heads):
    raise ConversionError(f"HF head_dim={hf['head_dim']}: expected hidden_size / num_attention_heads = {hidden // heads}")
  cfg = ml_collections.ConfigDict(base.to_dict())
  layers = int(hf["num_hidden_layers"])
  cfg.update(dict(
      vocab_size=int(hf["vocab_size"]), hidden_size=hidden, num_layers=layers, num_heads=heads,
      intermediate_size=int(hf["intermediate_size"]), max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
      type_vocab_size=0, position_offset=0, positions="rotary", norm="pre", mlp="geglu",
      layer_norm_eps=float(hf.get("norm_eps", 1e-5)), initializer_range=float(hf.get("initializer_range", 0.02)),
      # Training only: HF drops out the embeddings, the attention probabilities and output, and inside the MLP.
      hidden_dropout=float(hf.get("embedding_dropout", 0.0)), attention_dropout=float(hf.get("attention_dropout", 0.0)),
      embedding_norm=True, first_layer_attention_norm=False,
      attention_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)),
      norm_bias=bool(hf.get("norm_bias", False)), head_bias=bool(hf.get("classifier_bias", False)),
      rope_theta=_theta(hf, "full_attention", "global_rope_theta"),
      rope_theta_local=_theta(hf, "sliding_attention", "local_rope_theta"),
      global_attention_every=_global_every(hf, layers),
      # HF: |i - j| <= local_attention // 2; an odd local_attention means the even one below it.
      local_window=2 * (int(hf.get("local_attention", 128)) // 2),
      use_pooler=False))
  return cfg


def hf_config(cfg: ml_collections.ConfigDict, pad_token_id: int, bos_token_id: int | None = None,
              eos_token_id: int | None = None) -> dict:
  """A ModernBERT config.json dict for our `config.model` (ModernBERT-shaped models only)."""
  from mlm_jax.model import attention
  if not is_modernbert(cfg):
    raise ConversionError(
        f"model (norm={cfg.norm}, positions={cfg.positions}, mlp={cfg.mlp}, type_vocab_size={cfg.type_vocab_size}, "
        f"embedding_norm={cfg.embedding_norm}, first_layer_attention_norm={cfg.first_layer_attention_norm}) has no "
        "modernbert equivalent: expected pre / rotary / geglu / 0 / True / False")
  every = int(cfg.global_attention_every)
  types = ["full_attention" if attention.is_global(cfg, i) else "sliding_attention" for i in range(cfg.num_layers)]
  out = dict(
      model_type=ARCH, architectures=["ModernBertForMaskedLM"], vocab_size=cfg.vocab_size,
      hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      intermediate_size=cfg.intermediate_size, hidden_activation="gelu", classifier_activation="gelu",
      max_position_embeddings=cfg.max_position_embeddings, initializer_range=cfg.initializer_range,
      norm_eps=cfg.layer_norm_eps, norm_bias=bool(cfg.norm_bias), attention_bias=bool(cfg.attention_bias),
      mlp_bias=bool(cfg.mlp_bias), classifier_bias=bool(cfg.head_bias), decoder_bias=True,
      embedding_dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout, mlp_dropout=0.0,
      local_attention=int(cfg.local_window), layer_types=types,
      rope_parameters=dict(full_attention=dict(rope_type="default", rope_theta=float(cfg.rope_theta)),
                           sliding_attention=dict(rope_type="default", rope_theta=float(cfg.rope_theta_local))),
      # The released checkpoints' spelling of the same, for transformers 4.x.
      global_attn_every_n_layers=every if every > 1 else 1, global_rope_theta=float(cfg.rope_theta),
      local_rope_theta=float(cfg.rope_theta_local),
      pad_token_id=pad_token_id, tie_word_embeddings=True)
  if bos_token_id is not None:
    out.update(bos_token_id=bos_token_id, cls_token_id=bos_token_id)
  if eos_token_id is not None:
    out.update(eos_token_id=eos_token_id, sep_token_id=eos_token_id)
  return out


def _norms(ours: str, theirs: str, cfg) -> list[tuple[str, str]]:
  rows = [(f"{ours}.scale", f"{theirs}.weight")]
  return rows + [(f"{ours}.bias", f"{theirs}.bias")] if cfg.norm_bias else rows


def _plain(cfg: ml_collections.ConfigDict) -> list[tuple[str, str, str]]:
  """(our path, HF name, how) for the tensors that map one to one: 'copy' or 't' (Linear weight)."""
  rows = [("word_embeddings", "model.embeddings.tok_embeddings.weight", "copy")]
  rows += [(o, t, "copy") for o, t in _norms("embeddings_norm", "model.embeddings.norm", cfg)]
  rows += [(o, t, "copy") for o, t in _norms("final_norm", "model.final_norm", cfg)]
  for i in range(cfg.num_layers):
    L, H = f"layers.{i}", f"model.layers.{i}"
    if i > 0:
      rows += [(o, t, "copy") for o, t in _norms(f"{L}.attention_norm", f"{H}.attn_norm", cfg)]
    rows += [(o, t, "copy") for o, t in _norms(f"{L}.mlp_norm", f"{H}.mlp_norm", cfg)]
    rows.append((f"{L}.mlp.wo_kernel", f"{H}.mlp.Wo.weight", "t"))
    if cfg.mlp_bias:
      rows.append((f"{L}.mlp.wo_bias", f"{H}.mlp.Wo.bias", "copy"))
    if cfg.attention_bias:
      rows.append((f"{L}.attention.o_bias", f"{H}.attn.Wo.bias", "copy"))
  rows.append(("head_kernel", "head.dense.weight", "t"))
  if cfg.head_bias:
    rows.append(("head_bias", "head.dense.bias", "copy"))
  rows += [(o, t, "copy") for o, t in _norms("head_norm", "head.norm", cfg)]
  rows.append(("decoder_bias", "decoder.bias", "copy"))
  return rows


def _get(sd: Mapping, name: str, shape: tuple) -> np.ndarray:
  if name not in sd:
    raise ConversionError(f"HF checkpoint has no tensor {name}")
  value = np.asarray(sd[name])
  if tuple(value.shape) != tuple(shape):
    raise ConversionError(f"HF tensor {name}: shape {tuple(value.shape)} does not match the config's {tuple(shape)}")
  return value


def tensors_to_ours(sd: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """HF state dict (numpy, PyTorch layout) -> {our unscanned dotted path: array}; shapes checked by name."""
  h, f, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_heads
  d = h // n
  shapes = {"word_embeddings": (v, h), "decoder_bias": (v,), "head_kernel": (h, h)}
  out = {}
  for ours, theirs, how in _plain(cfg):
    if how == "t":
      want = (h, f) if ours.endswith("mlp.wo_kernel") else (h, h)
      out[ours] = _get(sd, theirs, want).T
    else:
      out[ours] = _get(sd, theirs, shapes.get(ours, (h,)))
  for i in range(cfg.num_layers):
    L, H = f"layers.{i}", f"model.layers.{i}"
    qkv = _get(sd, f"{H}.attn.Wqkv.weight", (3 * h, h))
    for j, name in enumerate("qkv"):
      out[f"{L}.attention.{name}_kernel"] = qkv[j * h:(j + 1) * h].T.reshape(h, n, d)
    out[f"{L}.attention.o_kernel"] = _get(sd, f"{H}.attn.Wo.weight", (h, h)).T.reshape(n, d, h)
    wi = _get(sd, f"{H}.mlp.Wi.weight", (2 * f, h))
    out[f"{L}.mlp.wi_kernel"], out[f"{L}.mlp.wg_kernel"] = wi[:f].T, wi[f:].T
    if cfg.attention_bias:
      qkv_bias = _get(sd, f"{H}.attn.Wqkv.bias", (3 * h,))
      for j, name in enumerate("qkv"):
        out[f"{L}.attention.{name}_bias"] = qkv_bias[j * h:(j + 1) * h].reshape(n, d)
    if cfg.mlp_bias:
      wi_bias = _get(sd, f"{H}.mlp.Wi.bias", (2 * f,))
      out[f"{L}.mlp.wi_bias"], out[f"{L}.mlp.wg_bias"] = wi_bias[:f], wi_bias[f:]
  return out


def tensors_to_hf(flat: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """{our unscanned dotted path: array} -> HF state dict; the decoder weight is tied (not written)."""
  h = cfg.hidden_size
  out = {theirs: (flat[ours].T if how == "t" else flat[ours]) for ours, theirs, how in _plain(cfg)}
  for i in range(cfg.num_layers):
    L, H = f"layers.{i}", f"model.layers.{i}"
    out[f"{H}.attn.Wqkv.weight"] = np.concatenate(
        [flat[f"{L}.attention.{name}_kernel"].reshape(h, h).T for name in "qkv"], axis=0)
    out[f"{H}.attn.Wo.weight"] = flat[f"{L}.attention.o_kernel"].reshape(h, h).T
    out[f"{H}.mlp.Wi.weight"] = np.concatenate([flat[f"{L}.mlp.wi_kernel"].T, flat[f"{L}.mlp.wg_kernel"].T], axis=0)
    if cfg.attention_bias:
      out[f"{H}.attn.Wqkv.bias"] = np.concatenate([flat[f"{L}.attention.{name}_bias"].reshape(-1) for name in "qkv"])
    if cfg.mlp_bias:
      out[f"{H}.mlp.Wi.bias"] = np.concatenate([flat[f"{L}.mlp.wi_bias"], flat[f"{L}.mlp.wg_bias"]])
  return {k: np.ascontiguousarray(x) for k, x in out.items()}
