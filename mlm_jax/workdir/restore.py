"""Restoring, the one place: a whole train state (resume, a branch's start), parameters alone, and a
workdir's encoder or objective module for init_from, fine-tuning, export, merging and the tools.

Shapes are checked against what the config builds before anything is read (one line naming the
array). Parameters alone are read with orbax's partial restore, so the optimizer's moments stay on
disk. An objective with several towers (ELECTRA) restores through `restore_objective`, whose module
its plug-in builds; converters take the parameters from there. Saving is checkpoints.py's.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from mlm_jax import paths
from mlm_jax.errors import CheckpointError
from mlm_jax.model import encoder, scan_layout
from mlm_jax.model.tree_paths import path_name
from mlm_jax.objectives import registry
from mlm_jax.workdir import migrate
from mlm_jax.workdir.checkpoints import Checkpointer
from mlm_jax.workdir.files import config_at


class Unreadable(CheckpointError):
  """A checkpoint whose files cannot be read (truncated, half-copied, corrupt): not a config mismatch."""


def check_shapes(meta: Any, abstract: Any, where: str, hint: str = "a checkpoint of another model shape?") -> None:
  """Raise CheckpointError naming the first array of `abstract` that the saved `meta` lacks or shapes differently."""
  saved = {path_name(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(meta) if hasattr(m, "shape")}
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
    name = path_name(path)
    if name not in saved:
      raise CheckpointError(f"checkpoint {where} has no array {name}: it was written by a different model or "
                            "optimizer config")
    if saved[name] != tuple(leaf.shape):
      raise CheckpointError(f"checkpoint {where}: {name} has shape {saved[name]}, but the config builds "
                            f"{tuple(leaf.shape)} ({hint})")


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)


def single_device(tree: Any) -> Any:
  """ShapeDtypeStructs of `tree` on the first local device: restores whatever mesh wrote them."""
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), tree)


def without_keys(params: Any, names: list) -> Any:
  """The top level of `params` without `names` (the container types below may change: callers map
  the result back onto their own tree by path)."""
  return type(params)({k: v for k, v in params.items() if k not in names}) if names else params


# -- the whole train state ---------------------------------------------------------------------------
def _check_compatible(ckpt: Checkpointer, step: int, abstract_state: Any) -> tuple[Any, Any]:
  """Raise CheckpointError naming the first parameter whose shape or presence differs; returns the tree
  to restore into and the function that makes `abstract_state`'s of it (workdir/migrate.py)."""
  try:
    meta = ckpt.manager.item_metadata(step)["state"]
  except Exception as e:  # unreadable metadata: a corrupt or foreign checkpoint
    raise Unreadable(f"checkpoint {ckpt.directory}/{step} cannot be read: {type(e).__name__}: {e}") from e
  item, upgrade = migrate.checkpoint_item(meta, abstract_state)
  check_shapes(meta, item, f"{ckpt.directory}/{step}")
  return item, upgrade


def restore_state(ckpt: Checkpointer, step: int, abstract_state: Any) -> tuple[Any, dict]:
  """(train state, data state) of checkpoint `step`, placed as `abstract_state` says (ShapeDtypeStructs
  with .sharding)."""
  item, upgrade = _check_compatible(ckpt, step, abstract_state)
  args = ocp.args.Composite(state=ocp.args.StandardRestore(item), data=ocp.args.JsonRestore())
  try:
    restored = ckpt.manager.restore(step, args=args)
  except Exception as e:
    raise Unreadable(f"checkpoint {ckpt.directory}/{step} could not be restored: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
  logging.info("restored checkpoint %s/%d", ckpt.directory, step)
  return upgrade(restored.state), dict(restored.data or {})


def restore_newest(ckpt: Checkpointer, abstract_state: Any, on_corrupt: str = "fallback") -> tuple[int, Any, dict]:
  """(step, state, data state) of the newest checkpoint that restores. With `on_corrupt`='fallback',
  unreadable newer ones are skipped with a warning and moved aside to `<step>.corrupt` once an older one
  has restored (never deleted: they can be inspected, or moved back); when none restores, nothing is
  moved and the newest's error stops the run. 'refuse': the newest's error stops it. A config mismatch
  (another model shape) always stops it."""
  skipped = []
  for step in sorted(ckpt.all_steps(), reverse=True):
    try:
      state, data = restore_state(ckpt, step, abstract_state)
    except Unreadable as e:
      if on_corrupt != "fallback":
        raise Unreadable(f"{e} (train.on_corrupt_checkpoint='refuse'; 'fallback' resumes from the newest "
                         "checkpoint that restores)") from None
      skipped.append((step, e))
      continue
    for bad, e in skipped:
      logging.warning("skipped checkpoint %d: %s; moved aside to %s", bad, " ".join(str(e).split()),
                      set_aside(ckpt, bad))
    return step, state, data
  raise skipped[0][1]


def set_aside(ckpt: Checkpointer, step: int) -> str:
  """Rename checkpoint `step` to `<step>.corrupt` (orbax lists numbered folders only), on process 0."""
  source = os.path.join(ckpt.directory, str(step))
  target, n = f"{source}.corrupt", 1
  while paths.exists(target):
    n += 1
    target = f"{source}.corrupt-{n}"
  if jax.process_index() == 0:
    try:
      if paths.is_remote(source):
        import tensorflow as tf
        tf.io.gfile.rename(source, target)
      else:
        os.rename(source, target)
    except Exception as e:
      raise CheckpointError(f"checkpoint {source} cannot be restored and could not be moved aside to {target} "
                            f"({type(e).__name__}: {e}): move or remove it by hand") from None
  from mlm_jax import runtime
  runtime.sync_processes(f"set_aside_{step}")
  ckpt.manager.reload()
  return target


# -- parameters alone --------------------------------------------------------------------------------
def restore_params(workdir: str, abstract_params: Any, step: int | None = None, subtree: str = "",
                   optional: tuple = (), item: str = "params") -> tuple[Any, int]:
  """(parameters, step) from WORKDIR/checkpoints: a training workdir or a `from_hf` output folder.

  Only the parameters are read (orbax's partial restore), placed as `abstract_params` says
  (ShapeDtypeStructs; with shardings for a mesh, or `single_device`); shapes are checked against it
  before anything is read. The optimizer's moments and counters stay on disk: restoring whole items
  put them, a few times the parameters, on one device of process 0. `subtree` names a part of
  `params` to restore as `abstract_params` (ELECTRA's `discriminator`), alone.
  `optional`: top-level parameters the checkpoint may lack; they are then absent from the result.
  `item`: "ema" reads the moving average of the parameters (train.ema_decay) instead.
  """
  directory = os.path.join(paths.absolute(workdir), "checkpoints")
  if paths.missing(directory):
    raise CheckpointError(f"{directory}: missing (no checkpoint was saved in {workdir})")
  options = ocp.CheckpointManagerOptions(create=False, read_only=True)
  manager = ocp.CheckpointManager(directory, options=options, item_handlers=dict(state=ocp.PyTreeCheckpointHandler()))
  try:
    steps = list(manager.all_steps())
    if not steps:
      raise CheckpointError(f"{directory}: no checkpoint")
    step = max(steps) if step is None else int(step)
    if step not in steps:
      raise CheckpointError(f"{directory}: no checkpoint for step {step} (have {', '.join(map(str, sorted(steps)))})")
    full = manager.item_metadata(step)["state"]
    if item not in full or full[item] is None:
      raise CheckpointError(f"{directory}/{step} has no {item} (train.ema_decay was 0 in that run)")
    meta = dict(full, params=full[item])   # the item, checked as the parameters are
    absent = [k for k in optional if k in abstract_params and k not in meta["params"]]
    if absent:
      abstract_params = without_keys(abstract_params, absent)
    placed = {subtree: abstract_params} if subtree else abstract_params
    check_shapes(meta, {"params": placed}, f"{directory}/{step}",
                 hint="does config.json describe the model that wrote it?")
    target = {item: placed}
    restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                     partial_restore=True)
    restored = manager.restore(step, args=ocp.args.Composite(state=restore))
  finally:
    manager.close()
  params = restored.state[item]
  return (params[subtree] if subtree else params), step


def restore_objective(workdir: str, config: ml_collections.ConfigDict, step: int | None = None,
                      item: str = "params"):
  """(graphdef, parameters on one device, step) of the module the run's objective trains (ELECTRA: both
  towers), from WORKDIR (`item="ema"`: their moving average)."""
  from flax import nnx
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: registry.for_config(config).make_model(config)), nnx.Param)
  params, step = restore_params(workdir, single_device(abstract), step, item=item)
  return graphdef, params, step


def restore_model(workdir: str, model_cfg: ml_collections.ConfigDict, step: int | None = None, subtree: str = "",
                  item: str = "params"):
  """(graphdef, parameters on one device, step) of the encoder `model_cfg` describes, from WORKDIR
  (`item="ema"`: their moving average)."""
  graphdef, abstract = encoder.abstract_model(model_cfg)
  params, step = restore_params(workdir, single_device(abstract), step, subtree=subtree, item=item)
  return graphdef, params, step


# -- a workdir's encoder for init_from and fine-tuning ------------------------------------------------
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
    params = restore_params(workdir, abstract_params, subtree=subtree, optional=optional)[0]
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
  check_shapes(host, without_keys(abstract_params, absent), f"{workdir} (restacked)")
  sharding = {path_name(p): a.sharding for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}
  return jax.tree_util.tree_map_with_path(lambda p, x: jax.device_put(x, sharding[path_name(p)]), host)
