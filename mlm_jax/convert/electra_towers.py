"""ELECTRA pair <-> transformers: the discriminator as `ElectraForPreTraining`, the generator as
`ElectraForMaskedLM`.

`to_hf` writes OUT/discriminator and OUT/generator, each a complete folder with the shared embeddings
copied into both; `params_from_hf` reads either back as one Encoder. docs/design_notes.md#electra_towers.
"""
from __future__ import annotations

import json
import os
from typing import Mapping

import jax
import ml_collections
import numpy as np

from mlm_jax.model import scan_layout
from mlm_jax.workdir import files as workdir_files, restore
from mlm_jax.convert import bert, tokenizer_files
from mlm_jax.errors import ConversionError
from mlm_jax.objectives import electra_model
from mlm_jax.model.tree_paths import path_name

ARCH = "electra"   # transformers' model_type
DISCRIMINATOR, GENERATOR = "ElectraForPreTraining", "ElectraForMaskedLM"


def _check_model(cfg: ml_collections.ConfigDict) -> None:
  if cfg.positions != "learned" or cfg.norm != "post" or cfg.mlp != "gelu":
    raise ConversionError(f"model (positions={cfg.positions}, norm={cfg.norm}, mlp={cfg.mlp}) has no ELECTRA "
                          "equivalent in transformers: expected learned / post / gelu")
  if cfg.position_offset != 0:
    raise ConversionError(f"model.position_offset={cfg.position_offset}: transformers' ELECTRA numbers "
                          "positions from 0 (train with --config.model.position_offset=0)")


def mapping(cfg: ml_collections.ConfigDict, kind: str) -> list:
  """(our path, HF name, hf->ours, ours->hf) for one tower: `kind` is DISCRIMINATOR or GENERATOR.

  Our discriminator paths are those of the Encoder plus `rtd_head.*` (the pair's head)."""
  from mlm_jax.model.encoder import embedding_size
  ident = lambda x: x
  t = lambda x: x.T
  as_bert = ml_collections.ConfigDict(cfg.to_dict())
  as_bert.use_pooler = False
  rows = [(ours, "electra." + theirs[len("bert."):], a, b) for ours, theirs, a, b in bert.mapping(as_bert, "bert")
          if theirs.startswith("bert.")]
  if embedding_size(cfg) != cfg.hidden_size:
    rows += [("embeddings_project_kernel", "electra.embeddings_project.weight", t, t),
             ("embeddings_project_bias", "electra.embeddings_project.bias", ident, ident)]
  if kind == GENERATOR:
    rows += [("head_kernel", "generator_predictions.dense.weight", t, t),
             ("head_bias", "generator_predictions.dense.bias", ident, ident),
             ("head_norm.scale", "generator_predictions.LayerNorm.weight", ident, ident),
             ("head_norm.bias", "generator_predictions.LayerNorm.bias", ident, ident),
             ("decoder_bias", "generator_lm_head.bias", ident, ident)]
  else:
    rows += [("rtd_head.dense_kernel", "discriminator_predictions.dense.weight", t, t),
             ("rtd_head.dense_bias", "discriminator_predictions.dense.bias", ident, ident),
             ("rtd_head.out_kernel", "discriminator_predictions.dense_prediction.weight", lambda w: w.reshape(-1),
              lambda k: k.reshape(1, -1)),
             ("rtd_head.out_bias", "discriminator_predictions.dense_prediction.bias", lambda b: b.reshape(()),
              lambda b: b.reshape(1))]
  return rows


def hf_config(cfg: ml_collections.ConfigDict, kind: str, tok) -> dict:
  """config.json of one tower (our model config `cfg`, with the tokenizer's special ids)."""
  from mlm_jax.model.encoder import embedding_size
  _check_model(cfg)
  return dict(
      model_type=ARCH, architectures=[kind], vocab_size=cfg.vocab_size, embedding_size=embedding_size(cfg),
      hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      intermediate_size=cfg.intermediate_size, hidden_act="gelu", hidden_dropout_prob=cfg.hidden_dropout,
      attention_probs_dropout_prob=cfg.attention_dropout, max_position_embeddings=cfg.max_position_embeddings,
      type_vocab_size=max(cfg.type_vocab_size, 1), initializer_range=cfg.initializer_range,
      layer_norm_eps=cfg.layer_norm_eps, position_embedding_type="absolute", pad_token_id=tok.pad_id,
      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, mask_token_id=tok.mask_id, tie_word_embeddings=True,
      dtype="float32")


def tower_flats(params, config: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
  """The pair's params -> {kind: flat unscanned params of that tower}; the shared tables go to both."""
  flat = bert.flatten(params)
  towers = {}
  for kind, prefix, cfg in ((DISCRIMINATOR, "discriminator.", electra_model.discriminator_config(config)),
                            (GENERATOR, "generator.", electra_model.generator_config(config))):
    own = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    if cfg.scan_layers:
      own = scan_layout.unscan_flat(own, cfg)
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
      if f"discriminator.{name}" in flat:
        own[name] = flat[f"discriminator.{name}"]
    for name in ("embeddings_norm.scale", "embeddings_norm.bias"):   # electra.share_embedding_norm
      if name not in own and f"discriminator.{name}" in flat:
        own[name] = flat[f"discriminator.{name}"]
    if kind == DISCRIMINATOR:
      own.update({k: v for k, v in flat.items() if k.startswith("rtd_head.")})
    towers[kind] = own
  return towers


def state_dict(flat: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict, kind: str) -> dict[str, np.ndarray]:
  out = {theirs: np.ascontiguousarray(to_hf(flat[ours]), dtype=np.float32) for ours, theirs, _, to_hf in
         mapping(cfg, kind)}
  if cfg.type_vocab_size == 0:   # transformers always has one token type: a zero row changes nothing
    from mlm_jax.model.encoder import embedding_size
    out["electra.embeddings.token_type_embeddings.weight"] = np.zeros((1, embedding_size(cfg)), np.float32)
  return out


def export(workdir: str, out: str, config, objective, step: int | None, arch: str | None, ema: bool) -> dict:
  """The exporter of `export_kind` 'electra' (folders.EXPORTERS): both towers, as `to_hf`."""
  if arch not in (None, ARCH):
    raise ConversionError(f"--arch={arch}: {workdir} is an ELECTRA run; it converts to transformers' ELECTRA only")
  return to_hf(workdir, out, step, ema=ema)


def to_hf(workdir: str, out: str, step: int | None = None, ema: bool = False) -> dict:
  """OUT/discriminator (ElectraForPreTraining) and OUT/generator (ElectraForMaskedLM) of the parameters
  (`ema`: of their moving average); `out` is checked by the caller (folders.to_hf)."""
  from safetensors.numpy import save_file
  config = workdir_files.config_at(workdir, step)
  _, params, step = restore.restore_objective(workdir, config, step, item="ema" if ema else "params")   # the pair
  tok = workdir_files.load_tokenizer(workdir_files.tokenizer_path(workdir, config), config.model.vocab_size)
  cfgs = {DISCRIMINATOR: electra_model.discriminator_config(config), GENERATOR: electra_model.generator_config(config)}
  hcfgs = {kind: hf_config(cfg, kind, tok) for kind, cfg in cfgs.items()}   # every check before writing
  flats = tower_flats(params, config)
  files = []
  for kind, sub in ((DISCRIMINATOR, "discriminator"), (GENERATOR, "generator")):
    folder = os.path.join(out, sub)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hcfgs[kind], f, indent=2, sort_keys=True)
    save_file(state_dict(flats[kind], cfgs[kind], kind), os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    written = ["config.json", "model.safetensors"] + tokenizer_files.write(
        tok, folder, model_max_length=cfgs[kind].max_position_embeddings)
    files += [f"{sub}/{name}" for name in written]
  return dict(step=step, arch=ARCH, files=files, out=out)


def kind_of(hcfg: Mapping) -> str:
  """GENERATOR or DISCRIMINATOR from an HF ELECTRA config.json (its `architectures`)."""
  archs = hcfg.get("architectures") or []
  if GENERATOR in archs:
    return GENERATOR
  if DISCRIMINATOR in archs:
    return DISCRIMINATOR
  raise ConversionError(f"ELECTRA config.json with architectures={archs}: expected {GENERATOR} (the generator) "
                        f"or {DISCRIMINATOR} (the discriminator)")


def model_config_from_hf(hcfg: Mapping, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Our Encoder config for one HF ELECTRA tower (the discriminator without MLM head)."""
  cfg = bert.model_config_from_hf(dict(hcfg, model_type="bert"), base)
  cfg.embedding_size = int(hcfg.get("embedding_size", cfg.hidden_size))
  cfg.mlm_head = kind_of(hcfg) == GENERATOR
  return cfg


def params_from_hf(sd: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict, kind: str, template) -> dict:
  """HF state dict -> flat params of one tower as `template` (an Encoder's; the discriminator's
  `rtd_head.*` are returned beside it, under that prefix, when the template has them)."""
  names = {path_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(template)}
  flat = {}
  for ours, theirs, to_ours, _ in mapping(cfg, kind):
    if ours.startswith("rtd_head.") and ours not in names:
      continue
    if theirs not in sd:
      raise ConversionError(f"HF checkpoint has no tensor {theirs} (needed for {ours})")
    flat[ours] = to_ours(np.asarray(sd[theirs]))
  if cfg.get("scan_layers"):
    flat = scan_layout.scan_flat(flat, cfg)
  return bert.fill(template, flat)
