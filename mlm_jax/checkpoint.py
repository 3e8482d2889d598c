"""Checkpoints: orbax CheckpointManager under WORKDIR/checkpoints.

Each checkpoint holds the whole TrainState (params, AdamW moments, step, skipped-update count) and
the data iterator's position, so a restored run continues the same data stream with the same
masks. Saves are asynchronous and atomic (orbax writes to a temporary directory and renames it
when complete), so a process killed mid-save leaves the previous checkpoint restorable.

Before restoring, every array's shape in the checkpoint is compared with what the config builds,
so a checkpoint of another model fails with one line naming the parameter, not an orbax traceback,
and nothing on disk is touched.

This module is also the one reader of workdirs (config.json, the run's tokenizer) and of
parameters alone (`restore_params`: for init_from, conversion, inference, on any device layout);
`convert/` imports it, never the reverse.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from mlm_jax.errors import CheckpointError


def path_name(path) -> str:
  """A pytree path as a dotted name (params.layers.0.attn.q_kernel), as the errors and converters name
  arrays; nnx's `value` level inside a Variable is left out."""
  keys = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
  return ".".join(str(k) for k in keys if k != "value")


def _handlers() -> dict:
  return dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler())


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


class Checkpointer:
  """Save / restore TrainState + data-iterator state; `keep` most recent checkpoints are kept."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=_handlers())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict | None, force: bool = True) -> bool:
    """Starts an async save (returns at once); a later save or `wait` finishes it."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {}))
    return self.manager.save(step, args=args, force=force)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def check_compatible(self, step: int, abstract_state: Any) -> None:
    """Raise CheckpointError naming the first parameter whose shape or presence differs."""
    try:
      meta = self.manager.item_metadata(step)["state"]
    except Exception as e:  # unreadable metadata: a corrupt or foreign checkpoint
      raise CheckpointError(f"checkpoint {self.directory}/{step} cannot be read: {type(e).__name__}: {e}") from e
    check_shapes(meta, abstract_state, f"{self.directory}/{step}")

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restore into the shardings of `abstract_state` (ShapeDtypeStructs with .sharding)."""
    self.check_compatible(step, abstract_state)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    try:
      restored = self.manager.restore(step, args=args)
    except Exception as e:
      raise CheckpointError(f"checkpoint {self.directory}/{step} could not be restored: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    logging.info("restored checkpoint %s/%d", self.directory, step)
    return restored.state, dict(restored.data or {})

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)


@jax.jit
def _all_finite(tree):
  leaves = [jax.numpy.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  return jax.numpy.stack(leaves).all() if leaves else jax.numpy.bool_(True)


def all_finite(tree: Any) -> bool:
  """True when every floating-point array is finite (one compiled reduction, one host sync)."""
  return bool(jax.device_get(_all_finite(tree)))


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json (written by the training binaries or by `from_hf`) as a ConfigDict."""
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
  if "model" in config and config.model.get("attention_impl") in ("splash", "cudnn"):
    # Resolved for the accelerator that trained it; a model built from it here (inference, conversion,
    # fine-tuning) picks the implementation of this host's platform again.
    config.model.attention_impl = "auto"
  return config


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


def single_device(tree: Any) -> Any:
  """ShapeDtypeStructs of `tree` on the first local device: restores whatever mesh wrote them."""
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), tree)


# What an objective adds on top of an encoder (NSP / SOP: the pooler and the two-way sentence head),
# and the model fields that add them. Continuing from a source without them (an MLM run, a
# BertForMaskedLM import) starts them fresh.
OBJECTIVE_PARAMS = ("pooler_kernel", "pooler_bias", "sentence_kernel", "sentence_bias")
OBJECTIVE_FIELDS = ("use_pooler", "sentence_head")


def restore_params(workdir: str, abstract_params: Any, step: int | None = None, subtree: str = "",
                   optional: tuple = ()) -> tuple[Any, int]:
  """(parameters, step) from WORKDIR/checkpoints: a training workdir or a `from_hf` output folder.

  Only the `params` subtree is placed as `abstract_params` says (ShapeDtypeStructs; with shardings
  for a mesh, or `single_device`); shapes are checked against it before anything is read. The
  rest of the state (optimizer moments, counters) comes along onto one device: orbax restores whole
  items, and it is a few times the parameters at most. `subtree` names a part of `params` to restore
  as `abstract_params` (ELECTRA's `discriminator`); the rest of `params` then comes along too.
  `optional`: top-level parameters the checkpoint may lack; they are then absent from the result.
  """
  directory = os.path.join(workdir if "://" in workdir else os.path.abspath(workdir), "checkpoints")
  if "://" not in directory and not os.path.isdir(directory):
    raise CheckpointError(f"{directory}: missing (no checkpoint was saved in {workdir})")
  options = ocp.CheckpointManagerOptions(create=False, read_only=True)
  manager = ocp.CheckpointManager(directory, options=options, item_handlers=_handlers())
  try:
    steps = list(manager.all_steps())
    if not steps:
      raise CheckpointError(f"{directory}: no checkpoint")
    step = max(steps) if step is None else int(step)
    if step not in steps:
      raise CheckpointError(f"{directory}: no checkpoint for step {step} (have {', '.join(map(str, sorted(steps)))})")
    meta = manager.item_metadata(step)["state"]
    absent = [k for k in optional if k in abstract_params and k not in meta["params"]]
    if absent:
      abstract_params = _without(abstract_params, absent)
    placed = {subtree: abstract_params} if subtree else abstract_params
    check_shapes(meta, {"params": placed}, f"{directory}/{step}",
                 hint="does config.json describe the model that wrote it?")
    target = dict(single_device(jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), dict(meta))))
    if subtree:
      target["params"] = dict(target["params"], **{subtree: abstract_params})
    else:
      target["params"] = abstract_params
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
  finally:
    manager.close()
  params = restored.state["params"]
  return (params[subtree] if subtree else params), step


def restore_params_for(workdir: str, model_cfg: ml_collections.ConfigDict, abstract_params: Any,
                       fresh: Any = None) -> Any:
  """`init_from`: the latest parameters of WORKDIR for the model `model_cfg` builds, placed as
  `abstract_params`; a source trained with the other `model.scan_layers` is restacked (scan_layout).
  With `fresh` (the freshly initialized parameters), OBJECTIVE_PARAMS the source lacks are taken from
  it, and the log says so."""
  from mlm_jax import scan_layout
  source_config = read_config(workdir)
  source, subtree = source_config.model, ""
  if source_config.get("objective", "mlm") == "electra":   # the discriminator (model_cfg has no MLM head)
    source, subtree = ml_collections.ConfigDict(source.to_dict()), "discriminator"
    source.mlm_head = False
  optional = OBJECTIVE_PARAMS if fresh is not None else ()
  if bool(source.get("scan_layers", False)) == bool(model_cfg.get("scan_layers", False)):
    params = restore_params(workdir, abstract_params, subtree=subtree, optional=optional)[0]
  else:
    _, params, _ = restore_model(workdir, source, subtree=subtree)
    shape = ml_collections.ConfigDict(model_cfg.to_dict())
    if optional:   # restack what the source has
      shape.update({k: source.get(k, False) for k in OBJECTIVE_FIELDS})
    host = (scan_layout.scan_params(params, shape) if model_cfg.scan_layers else
            scan_layout.unscan_params(params, source))
    check_shapes(host, _without(abstract_params, [k for k in optional if k in abstract_params and k not in host]),
                 f"{workdir} (restacked)")
    sharding = {path_name(p): a.sharding for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}
    params = jax.tree_util.tree_map_with_path(lambda p, x: jax.device_put(x, sharding[path_name(p)]), host)
  missing = [k for k in abstract_params if k not in params]
  if not missing:
    return params
  logging.info("init_from %s has no %s: initialized fresh", workdir, ", ".join(missing))
  have = {path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
  new = {path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(fresh)}
  return jax.tree_util.tree_map_with_path(lambda p, _: have.get(path_name(p), new[path_name(p)]), abstract_params)


def _without(params: Any, names: list) -> Any:
  """The top level of `params` without `names` (the container types below may change: callers map
  the result back onto their own tree by path)."""
  return type(params)({k: v for k, v in params.items() if k not in names}) if names else params


def restore_model(workdir: str, model_cfg: ml_collections.ConfigDict, step: int | None = None, subtree: str = ""):
  """(graphdef, parameters on one device, step) of the encoder `model_cfg` describes, from WORKDIR."""
  from mlm_jax import step as step_lib
  graphdef, abstract = step_lib.abstract_model(model_cfg)
  params, step = restore_params(workdir, single_device(abstract), step, subtree=subtree)
  return graphdef, params, step
