"""Weight-name mapping between our Encoder and Hugging Face BERT / RoBERTa / XLM-R masked LMs.

One table (`mapping`) serves both directions, so HF -> ours -> HF is exact by construction; a scanned
model converts through the unscanned names. ModernBERT has its own module (modernbert.py), to which
the functions here hand `arch='modernbert'`. Details: docs/design_notes.md#bert.
"""
from __future__ import annotations

from typing import Callable, Mapping

import jax
import numpy as np
import ml_collections

from mlm_jax.model import scan_layout
from mlm_jax.model.tree_paths import fill, flatten, path_name  # noqa: F401  (bert.flatten / bert.fill: the converters' names)
from mlm_jax.convert import modernbert
from mlm_jax.errors import ConversionError

BERT_ARCHS = ("bert", "roberta", "xlm-roberta")   # the architectures of this module's table
ARCHS = BERT_ARCHS + (modernbert.ARCH,)


def _prefix(arch: str) -> str:
  if arch not in BERT_ARCHS:
    raise ConversionError(f"unknown architecture {arch!r} for the BERT table: expected one of {BERT_ARCHS}")
  return "bert" if arch == "bert" else "roberta"


def model_config_from_hf(hf: Mapping, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Our `config.model` for an HF config dict (config.json); `base` supplies the non-HF fields."""
  arch = arch_from_hf(hf)
  if arch == modernbert.ARCH:
    return modernbert.model_config_from_hf(hf, base)
  cfg = ml_collections.ConfigDict(base.to_dict())
  act = hf.get("hidden_act", "gelu")
  if act != "gelu":
    raise ConversionError(f"HF hidden_act={act!r}: only exact 'gelu' is supported")
  pet = hf.get("position_embedding_type", "absolute")
  if pet != "absolute":
    raise ConversionError(f"HF position_embedding_type={pet!r}: only 'absolute' is supported")
  cfg.vocab_size = int(hf["vocab_size"])
  cfg.hidden_size = int(hf["hidden_size"])
  cfg.num_layers = int(hf["num_hidden_layers"])
  cfg.num_heads = int(hf["num_attention_heads"])
  cfg.intermediate_size = int(hf["intermediate_size"])
  cfg.max_position_embeddings = int(hf["max_position_embeddings"])
  cfg.type_vocab_size = int(hf.get("type_vocab_size", 0))
  cfg.layer_norm_eps = float(hf.get("layer_norm_eps", 1e-12))
  cfg.hidden_dropout = float(hf.get("hidden_dropout_prob", 0.1))
  cfg.attention_dropout = float(hf.get("attention_probs_dropout_prob", 0.1))
  cfg.initializer_range = float(hf.get("initializer_range", 0.02))
  cfg.position_offset = 0 if arch == "bert" else int(hf.get("pad_token_id", 1)) + 1
  cfg.positions, cfg.norm, cfg.mlp = "learned", "post", "gelu"
  from mlm_jax.model import encoder
  cfg.update({k: True for k in (*encoder.MODEL_FIELDS, "embedding_norm")})   # every bias and norm
  return cfg


def arch_from_hf(hf: Mapping) -> str:
  model_type = hf.get("model_type", "")
  if model_type not in ARCHS:
    raise ConversionError(f"HF model_type={model_type!r}: expected one of {ARCHS}")
  return model_type


def hf_config(cfg: ml_collections.ConfigDict, arch: str, pad_token_id: int, bos_token_id: int | None = None,
              eos_token_id: int | None = None) -> dict:
  """An HF config.json dict for our `config.model` (post-LN, learned positions, GELU models only)."""
  from mlm_jax.model import encoder
  extra = encoder.no_hf_equivalent(cfg)
  if extra:
    raise ConversionError(f"model.{extra[0]}=True (an LTG-BERT / ELC-BERT switch) has no equivalent in transformers: "
                          "this model cannot be exported (docs/model.md)")
  if arch == modernbert.ARCH:
    return modernbert.hf_config(cfg, pad_token_id, bos_token_id, eos_token_id)
  _prefix(arch)
  if cfg.positions != "learned" or cfg.norm != "post" or cfg.mlp != "gelu":
    raise ConversionError(f"model (positions={cfg.positions}, norm={cfg.norm}, mlp={cfg.mlp}) has no "
                          f"{arch} equivalent in transformers: expected learned / post / gelu")
  switched_off = [k for k in (*encoder.MODEL_FIELDS, "embedding_norm") if not cfg[k]]
  if switched_off:
    raise ConversionError(f"model.{switched_off[0]}=False has no {arch} equivalent in transformers (its layers "
                          "all have biases and norms)")
  if arch != "bert" and cfg.position_offset != pad_token_id + 1:
    raise ConversionError(f"model.position_offset={cfg.position_offset}: {arch} needs pad_token_id + 1 = "
                          f"{pad_token_id + 1}")
  if arch == "bert" and cfg.position_offset != 0:
    raise ConversionError(f"model.position_offset={cfg.position_offset}: bert needs 0")
  out = dict(
      model_type=arch,
      architectures=[{"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM",
                      "xlm-roberta": "XLMRobertaForMaskedLM"}[arch]],
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act="gelu",
      hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
      max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=max(cfg.type_vocab_size, 1),
      initializer_range=cfg.initializer_range, layer_norm_eps=cfg.layer_norm_eps,
      position_embedding_type="absolute", pad_token_id=pad_token_id, tie_word_embeddings=True,
  )
  if bos_token_id is not None:
    out["bos_token_id"] = bos_token_id
  if eos_token_id is not None:
    out["eos_token_id"] = eos_token_id
  return out


def _linear_in(n=None, d=None):
  """HF Linear weight [out, in] -> our kernel [in, out] (optionally out split into heads)."""
  def f(w):
    k = w.T
    return k if n is None else k.reshape(k.shape[0], n, d)
  return f


def _linear_out_heads(n, d):
  """HF attention output weight [H, n*d] -> our o_kernel [n, d, H]."""
  return lambda w: w.T.reshape(n, d, w.shape[0])


def mapping(cfg: ml_collections.ConfigDict, arch: str) -> list[tuple[str, str, Callable, Callable]]:
  """(our path, HF name, hf->ours, ours->hf) for every tensor of the model."""
  p = _prefix(arch)
  n, d = cfg.num_heads, cfg.hidden_size // cfg.num_heads
  ident = lambda x: x
  t = lambda x: x.T
  heads = lambda x: x.reshape(n, d)
  flat = lambda x: x.reshape(-1)
  rows = [
      ("word_embeddings", f"{p}.embeddings.word_embeddings.weight", ident, ident),
      ("position_embeddings", f"{p}.embeddings.position_embeddings.weight", ident, ident),
      ("embeddings_norm.scale", f"{p}.embeddings.LayerNorm.weight", ident, ident),
      ("embeddings_norm.bias", f"{p}.embeddings.LayerNorm.bias", ident, ident),
  ]
  if cfg.type_vocab_size > 0:
    rows.append(("token_type_embeddings", f"{p}.embeddings.token_type_embeddings.weight", ident, ident))
  for i in range(cfg.num_layers):
    L, H = f"layers.{i}", f"{p}.encoder.layer.{i}"
    for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
      rows.append((f"{L}.attention.{ours}_kernel", f"{H}.attention.self.{theirs}.weight", _linear_in(n, d),
                   lambda k: k.reshape(k.shape[0], -1).T))
      rows.append((f"{L}.attention.{ours}_bias", f"{H}.attention.self.{theirs}.bias", heads, flat))
    rows += [
        (f"{L}.attention.o_kernel", f"{H}.attention.output.dense.weight", _linear_out_heads(n, d),
         lambda k: k.reshape(-1, k.shape[-1]).T),
        (f"{L}.attention.o_bias", f"{H}.attention.output.dense.bias", ident, ident),
        (f"{L}.attention_norm.scale", f"{H}.attention.output.LayerNorm.weight", ident, ident),
        (f"{L}.attention_norm.bias", f"{H}.attention.output.LayerNorm.bias", ident, ident),
        (f"{L}.mlp.wi_kernel", f"{H}.intermediate.dense.weight", t, t),
        (f"{L}.mlp.wi_bias", f"{H}.intermediate.dense.bias", ident, ident),
        (f"{L}.mlp.wo_kernel", f"{H}.output.dense.weight", t, t),
        (f"{L}.mlp.wo_bias", f"{H}.output.dense.bias", ident, ident),
        (f"{L}.mlp_norm.scale", f"{H}.output.LayerNorm.weight", ident, ident),
        (f"{L}.mlp_norm.bias", f"{H}.output.LayerNorm.bias", ident, ident),
    ]
  if arch == "bert":
    head = [("head_kernel", "cls.predictions.transform.dense.weight", t, t),
            ("head_bias", "cls.predictions.transform.dense.bias", ident, ident),
            ("head_norm.scale", "cls.predictions.transform.LayerNorm.weight", ident, ident),
            ("head_norm.bias", "cls.predictions.transform.LayerNorm.bias", ident, ident),
            ("decoder_bias", "cls.predictions.bias", ident, ident)]
  else:
    head = [("head_kernel", "lm_head.dense.weight", t, t),
            ("head_bias", "lm_head.dense.bias", ident, ident),
            ("head_norm.scale", "lm_head.layer_norm.weight", ident, ident),
            ("head_norm.bias", "lm_head.layer_norm.bias", ident, ident),
            ("decoder_bias", "lm_head.bias", ident, ident)]
  rows += head
  if cfg.use_pooler:
    rows += [("pooler_kernel", f"{p}.pooler.dense.weight", t, t),
             ("pooler_bias", f"{p}.pooler.dense.bias", ident, ident)]
  if cfg.sentence_head and arch == "bert":   # BertForPreTraining's NSP head; other archs drop it
    rows += [("sentence_kernel", "cls.seq_relationship.weight", t, t),
             ("sentence_bias", "cls.seq_relationship.bias", ident, ident)]
  return rows


def params_from_hf(state_dict: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict, arch: str,
                   template) -> object:
  """HF state dict (numpy) -> our params, in the structure of `template`; tensors checked by name.

  Each HF tensor's shape is compared with the one the config implies before it is reshaped, so a
  mismatch names both the HF tensor and our parameter instead of failing inside a reshape.
  """
  if arch == modernbert.ARCH:
    flat = modernbert.tensors_to_ours(state_dict, cfg)
    return fill(template, scan_layout.scan_flat(flat, cfg) if cfg.get("scan_layers") else flat)
  shapes = {path_name(path): tuple(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(template)}
  if cfg.get("scan_layers"):
    shapes = {name: x.shape for name, x in scan_layout.unscan_flat(
        {k: np.broadcast_to(np.int8(0), v) for k, v in shapes.items()}, cfg).items()}
  flat = {}
  for ours, theirs, to_ours, to_hf in mapping(cfg, arch):
    if theirs not in state_dict:
      raise ConversionError(f"HF checkpoint has no tensor {theirs} (needed for {ours})")
    value = np.asarray(state_dict[theirs])
    if ours in shapes:
      want = tuple(jax.eval_shape(to_hf, jax.ShapeDtypeStruct(shapes[ours], np.float32)).shape)
      if tuple(value.shape) != want:
        raise ConversionError(f"parameter {ours}: shape {tuple(value.shape)} of HF tensor {theirs} does not match "
                              f"the config's {want}")
    flat[ours] = to_ours(value)
  return fill(template, scan_layout.scan_flat(flat, cfg) if cfg.get("scan_layers") else flat)


def params_to_hf(params, cfg: ml_collections.ConfigDict, arch: str) -> dict[str, np.ndarray]:
  """Our params -> HF state dict (numpy), including the tied decoder weight and bias names."""
  flat = flatten(params)
  if cfg.get("scan_layers"):
    flat = scan_layout.unscan_flat(flat, cfg)
  if arch == modernbert.ARCH:
    return modernbert.tensors_to_hf(flat, cfg)
  out = {theirs: np.ascontiguousarray(to_hf(flat[ours])) for ours, theirs, _, to_hf in mapping(cfg, arch)}
  return out
