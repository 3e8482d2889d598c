"""Reading a workdir (a training run's, or a `from_hf` output folder): its config.json, its tokenizer,
and its parameters as the encoder that `init_from` and fine-tuning start from.

config.json is completed once, here, when it is read (`migrate`): fields that later versions added
get the value that older runs meant, so every other module can read any field of any config.
Checkpoints themselves (orbax) are checkpoint.py's.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
from absl import logging

from mlm_jax.model import attention, encoder as model_lib, scan_layout
from mlm_jax.workdir import checkpoints as ckpt_lib
from mlm_jax.errors import CheckpointError
from mlm_jax.objectives import registry
from mlm_jax.model.tree_paths import path_name


def migrate_model(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`cfg` (a config.json's `model`) with the fields added since it was written filled in, as older
  runs meant them: model.MODEL_FIELDS (every bias and norm), attention.NEW_FIELDS (all-global,
  unscanned) and `embedding_norm` (post-LN normalized the embeddings, pre-LN did not)."""
  missing = {k: v for k, v in {**model_lib.MODEL_FIELDS, **attention.NEW_FIELDS}.items() if k not in cfg}
  if "embedding_norm" not in cfg:
    missing["embedding_norm"] = cfg.norm == "post"
  if not missing:
    return cfg
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.update(missing)
  return out


def migrate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The one migration of a config.json as read: older files completed, the platform's choices undone."""
  if "model" in config:
    config.model = migrate_model(config.model)
    if config.model.get("attention_impl") in ("splash", "cudnn"):
      # Resolved for the accelerator that trained it; a model built from it here (inference, conversion,
      # fine-tuning) picks the implementation of this host's platform again.
      config.model.attention_impl = "auto"
  if "data" in config and "packing_fit" not in config.data:
    config.data.packing_fit = "next"   # written before best-fit packing: the rows it trained on
  if "electra" in config and "share_embedding_norm" not in config.electra:
    config.electra.share_embedding_norm = False   # each tower kept its own embedding LayerNorm then
  if "objective" not in config and "masking" in config:   # runs from before objectives existed were MLM
    config.objective = registry.DEFAULT
  return config


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json (written by the training binaries or by `from_hf`) as a ConfigDict, migrated."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isdir(workdir):
    raise CheckpointError(f"workdir {workdir}: no such directory")
  if not os.path.exists(path):
    raise CheckpointError(f"{path}: missing (not a workdir of mlm_jax.train or a from_hf output)")
  with open(path, encoding="utf-8") as f:
    try:
      config = ml_collections.ConfigDict(json.load(f))
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  return migrate(config)


def tokenizer_path(workdir: str, config: ml_collections.ConfigDict) -> str:
  """The run's tokenizer: `data.tokenizer`, or the sentencepiece model the run trained into WORKDIR/tokenizer."""
  path = config.data.tokenizer if "data" in config and config.data.get("tokenizer") else ""
  return path or os.path.join(workdir, "tokenizer", "spm.model")


def load_tokenizer(path: str, vocab_size: int | None = None):
  """The tokenizer at `path`, checked against the model's vocabulary size."""
  from mlm_jax.data.tokenizers import load as tok_lib
  if "://" not in path and not os.path.exists(path):
    raise CheckpointError(f"tokenizer {path}: missing")
  tok = tok_lib.load(path)
  if vocab_size is not None and tok.vocab_size != vocab_size:
    raise CheckpointError(f"vocab size mismatch: the model has vocab_size={vocab_size} but the tokenizer "
                          f"{path} has {tok.vocab_size} pieces")
  return tok


def encoder_of(config: ml_collections.ConfigDict) -> tuple[str, ml_collections.ConfigDict]:
  """(subtree of the run's parameters, model config) of the encoder its objective trained (ELECTRA:
  the discriminator): what init_from and fine-tuning start from."""
  return registry.for_config(config).encoder(config)


# What an objective adds on top of an encoder (NSP / SOP: the pooler and the two-way sentence head),
# and the model fields that add them. Continuing from a source without them (an MLM run, a
# BertForMaskedLM import) starts them fresh.
OBJECTIVE_PARAMS = ("pooler_kernel", "pooler_bias", "sentence_kernel", "sentence_bias")
OBJECTIVE_FIELDS = ("use_pooler", "sentence_head")


def restore_params_for(workdir: str, model_cfg: ml_collections.ConfigDict, abstract_params: Any,
                       fresh: Any = None) -> Any:
  """`init_from`: the latest parameters of WORKDIR's encoder for the model `model_cfg` builds, placed as
  `abstract_params`; a source trained with the other `model.scan_layers` is restacked (scan_layout).
  With `fresh` (the freshly initialized parameters), OBJECTIVE_PARAMS the source lacks are taken from
  it, and the log says so."""
  subtree, source = encoder_of(read_config(workdir))
  optional = OBJECTIVE_PARAMS if fresh is not None else ()
  if bool(source.get("scan_layers", False)) == bool(model_cfg.get("scan_layers", False)):
    params = ckpt_lib.restore_params(workdir, abstract_params, subtree=subtree, optional=optional)[0]
  else:
    params = _restacked(workdir, source, subtree, model_cfg, abstract_params, optional)
  missing = [k for k in abstract_params if k not in params]
  if not missing:
    return params
  logging.info("init_from %s has no %s: initialized fresh", workdir, ", ".join(missing))
  have = {path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
  new = {path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(fresh)}
  return jax.tree_util.tree_map_with_path(lambda p, _: have.get(path_name(p), new[path_name(p)]), abstract_params)


def _restacked(workdir: str, source: ml_collections.ConfigDict, subtree: str, model_cfg: ml_collections.ConfigDict,
               abstract_params: Any, optional: tuple) -> Any:
  """The source's parameters in the other scan layout, placed as `abstract_params`."""
  _, params, _ = restore_model(workdir, source, subtree=subtree)
  shape = ml_collections.ConfigDict(model_cfg.to_dict())
  if optional:   # restack what the source has
    shape.update({k: source.get(k, False) for k in OBJECTIVE_FIELDS})
  host = (scan_layout.scan_params(params, shape) if model_cfg.scan_layers else
          scan_layout.unscan_params(params, source))
  ckpt_lib.check_shapes(host, ckpt_lib.without_keys(abstract_params, [k for k in optional if k in abstract_params
                                                                      and k not in host]),
                        f"{workdir} (restacked)")
  sharding = {path_name(p): a.sharding for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}
  return jax.tree_util.tree_map_with_path(lambda p, x: jax.device_put(x, sharding[path_name(p)]), host)


def restore_model(workdir: str, model_cfg: ml_collections.ConfigDict, step: int | None = None, subtree: str = ""):
  """(graphdef, parameters on one device, step) of the encoder `model_cfg` describes, from WORKDIR."""
  graphdef, abstract = model_lib.abstract_model(model_cfg)
  params, step = ckpt_lib.restore_params(workdir, ckpt_lib.single_device(abstract), step, subtree=subtree)
  return graphdef, params, step


def restore_objective_model(workdir: str, config: ml_collections.ConfigDict, step: int | None = None):
  """(the module the run's objective trains, with WORKDIR's parameters on one device, step)."""
  from flax import nnx
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: registry.for_config(config).make_model(config)), nnx.Param)
  params, step = ckpt_lib.restore_params(workdir, ckpt_lib.single_device(abstract), step)
  return nnx.merge(graphdef, params), step
