"""A workdir's parameters as the encoder that `init_from`, fine-tuning and the tools start from:
which subtree its objective trained, restored for any model layout (scanned or not) and device
layout, with the parameters an objective adds filled in fresh where the source lacks them."""
from __future__ import annotations

from typing import Any

import jax
import ml_collections
from absl import logging

from mlm_jax.model import encoder, scan_layout
from mlm_jax.model.tree_paths import path_name
from mlm_jax.objectives import registry
from mlm_jax.workdir import checkpoints
from mlm_jax.workdir.files import config_at


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
  subtree, source = encoder_of(config_at(workdir))   # the newest checkpoint's (its phase's)
  optional = OBJECTIVE_PARAMS if fresh is not None else ()
  if bool(source.get("scan_layers", False)) == bool(model_cfg.get("scan_layers", False)):
    params = checkpoints.restore_params(workdir, abstract_params, subtree=subtree, optional=optional)[0]
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
  absent = [k for k in optional if k in abstract_params and k not in host]
  checkpoints.check_shapes(host, checkpoints.without_keys(abstract_params, absent), f"{workdir} (restacked)")
  sharding = {path_name(p): a.sharding for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}
  return jax.tree_util.tree_map_with_path(lambda p, x: jax.device_put(x, sharding[path_name(p)]), host)


def restore_model(workdir: str, model_cfg: ml_collections.ConfigDict, step: int | None = None, subtree: str = "",
                  item: str = "params"):
  """(graphdef, parameters on one device, step) of the encoder `model_cfg` describes, from WORKDIR
  (`item="ema"`: their moving average)."""
  graphdef, abstract = encoder.abstract_model(model_cfg)
  params, step = checkpoints.restore_params(workdir, checkpoints.single_device(abstract), step, subtree=subtree,
                                            item=item)
  return graphdef, params, step


def restore_objective_model(workdir: str, config: ml_collections.ConfigDict, step: int | None = None):
  """(the module the run's objective trains, with WORKDIR's parameters on one device, step)."""
  from flax import nnx
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: registry.for_config(config).make_model(config)), nnx.Param)
  params, step = checkpoints.restore_params(workdir, checkpoints.single_device(abstract), step)
  return nnx.merge(graphdef, params), step
