"""The one place for compatibility with earlier workdirs: config.json upgraded to today's layout, step by
step, a checkpoint of an older train state read into today's, and a saved data state (the input's
position) brought to today's form before the input resumes from it (`data_state`).

Each version's config.json is upgraded to the next one's by one function of `STEPS`, so a reader
(workdir/files.py) sees only today's layout, and no other module keeps a branch for an older file:

  1 (no `version`): one flat config, the resolved one, as runs wrote it before the user's config and the
    derived values were kept apart; fields added since are filled in with what those runs meant (a
    phase's `values` too).
  2: {"version": 2, "config": the user's config, "derived": what resolution derived} (config/derived.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from mlm_jax.config import derived as derived_lib
from mlm_jax.data import fingerprint
from mlm_jax.errors import CheckpointError
from mlm_jax.model import attention, encoder, matmul
from mlm_jax.objectives import registry

VERSION = 2


def version_of(raw: dict) -> int:
  """The layout version of a config.json's contents (1: a flat config without `version`)."""
  version = raw.get("version")
  return version if isinstance(version, int) and isinstance(raw.get("config"), dict) else 1


def config_json(raw: dict, where: str = "config.json") -> dict:
  """`raw` (a config.json's contents, any version) as today's layout: {"version", "config", "derived"}."""
  version = version_of(raw)
  if version > VERSION:
    raise CheckpointError(f"{where}: layout version {version}, newer than this mlm_jax reads ({VERSION})")
  while version < VERSION:
    raw = STEPS[version](raw)
    version += 1
  return raw


def migrate_model(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`cfg` (a config.json's `model`) with the fields added since it was written filled in, as older
  runs meant them: encoder.MODEL_FIELDS (every bias and norm), encoder.LTG_FIELDS (off),
  encoder.HEAD_FIELDS (no embedding projection, an MLM head, no sentence head), attention.NEW_FIELDS
  (all-global, unscanned), matmul.NEW_FIELDS (`auto`) and `embedding_norm` (post-LN normalized the
  embeddings, pre-LN did not); and `attention_impl` '' (the first configs' name for auto) as `auto`."""
  filled = {k: v for k, v in {**encoder.MODEL_FIELDS, **encoder.LTG_FIELDS, **encoder.HEAD_FIELDS,
                              **attention.NEW_FIELDS, **matmul.NEW_FIELDS}.items()
            if k not in cfg}
  if "embedding_norm" not in cfg:
    filled["embedding_norm"] = cfg.norm == "post"
  if cfg.get("attention_impl") == "":
    filled["attention_impl"] = "auto"
  if not filled:
    return cfg
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.update(filled)
  return out


def _complete(flat: dict) -> dict:
  """A flat (version 1) config with the fields added since it was written, as the run that wrote it meant them."""
  config = ml_collections.ConfigDict(flat)
  if "kind" not in config:   # written before configs said what they are for: the sections tell
    config.kind = "finetuning" if "task" in config else "pretraining"
  if "model" in config:
    config.model = migrate_model(config.model)
  if "data" in config and "packing_fit" not in config.data:
    config.data.packing_fit = "next"   # written before best-fit packing: the rows it trained on
  if "data" in config and "packing_window" not in config.data:
    config.data.packing_window = 256   # its only value before it was a field
  if "masking" in config:   # written before mask-rate schedules: a constant rate
    for field, value in dict(mask_rate_schedule=(), mask_rate_schedule_mode="constant").items():
      if field not in config.masking:
        config.masking[field] = value
  if config.kind == "pretraining":   # written before z-loss: none
    if "loss" not in config:
      config.loss = ml_collections.ConfigDict()
    if "z_loss" not in config.loss:
      config.loss.z_loss = 0.0
  if "electra" in config and "share_embedding_norm" not in config.electra:
    config.electra.share_embedding_norm = False   # each tower kept its own embedding LayerNorm then
  if "objective" not in config and config.kind == "pretraining":   # runs from before objectives existed were MLM
    config.objective = registry.DEFAULT
  out = derived_lib.as_json(config)
  if out.get("phases"):
    out["phases"] = _phase_values(out["phases"])
  return out


# What config/phases.recorded writes into each phase besides its overrides.
_PHASE_RECORD_KEYS = ("name", "end_step", "end_tokens", "start_step", "values")


def _phase_values(phases: list) -> list:
  """Phases recorded before each carried its `values` (the fields that differ between the phases): a
  phase's values are then its own overrides over those of the phases before it (a field only a later
  phase set keeps the last phase's value), as at_step read them."""
  out, values = [], {}
  for entry in phases:   # as recorded: a list of [key, value] pairs
    pairs = dict(entry)
    values.update({k: v for k, v in pairs.items() if k not in _PHASE_RECORD_KEYS})
    if "values" not in pairs:
      entry = list(entry) + [["values", [[k, v] for k, v in values.items()]]]
    out.append(entry)
  return out


def _v1_to_v2(flat: dict) -> dict:
  """Completed, then the fields only resolution sets (the tokenizer's ids) moved into `derived`; the rest
  stays the config (which of its values the user set and which were derived, the file does not say)."""
  config = _complete(flat)
  derived = {}
  for dotted in derived_lib.FROM_TOKENIZER:
    section, field = dotted.split(".")
    if field in config.get(section, {}):
      derived.setdefault(section, {})[field] = config[section].pop(field)
  return {"version": 2, "config": config, "derived": derived}


STEPS = {1: _v1_to_v2}   # version -> the function that upgrades its contents to the next version


def checkpoint_item(meta: Any, abstract_state: Any) -> tuple[Any, Callable[[Any], Any]]:
  """(the tree to restore a checkpoint into, the function that makes today's state of what restored it), for
  a checkpoint whose tree metadata is `meta` and today's `abstract_state`:

  - a checkpoint written before the train state had `ema` restores without it (train.ema_decay off: the
    field stays None);
  - an optimizer state saved as optax.adamw's own nested chain (Adam, the decay mask, the learning rate:
    runs before training/optim.py built AdamW's parts in its own chain) restores nested, then flattened
    into today's chain (the same arrays, the same update).
  """
  if not dataclasses.is_dataclass(abstract_state):
    return abstract_state, lambda restored: restored
  item, upgrades = abstract_state, []
  at = _nested_adamw_at(meta["opt_state"] if "opt_state" in meta.keys() else None,
                        getattr(abstract_state, "opt_state", None))
  if at is not None:
    opt = abstract_state.opt_state
    item = item.replace(opt_state=opt[:at] + (tuple(opt[at:at + 3]),) + opt[at + 3:])
    upgrades.append(lambda s: s.replace(opt_state=s.opt_state[:at] + tuple(s.opt_state[at]) + s.opt_state[at + 1:]))
  if getattr(abstract_state, "ema", 0) is None and "ema" not in meta.keys():
    base, item = item, {f.name: getattr(item, f.name) for f in dataclasses.fields(item) if f.name != "ema"}
    upgrades.insert(0, lambda restored: base.replace(**restored))   # first: the dict back into a state

  def upgrade(restored):
    for step in upgrades:
      restored = step(restored)
    return restored

  return item, upgrade


def _nested_adamw_at(saved: Any, opt_state: Any) -> int | None:
  """Where `saved` (a checkpoint's opt_state metadata) holds optax.adamw's state as one nested chain of
  three, where today's chain `opt_state` holds the three in a row; None when it does not."""
  if saved is None or type(opt_state) is not tuple or not isinstance(saved, (list, tuple)):
    return None
  if len(saved) != len(opt_state) - 2:
    return None
  for at, part in enumerate(saved):
    if isinstance(part, (list, tuple)) and len(part) == 3 and isinstance(part[0], dict) and "mu" in part[0]:
      return at
  return None


def data_state(saved: dict, *, process_count: int | None = None, sources: list | None = None,
               eval_sources: list | None = None, fingerprint_keys: dict | None = None,
               portable_sources: list | None = None) -> dict:
  """`saved` (a checkpoint's data item) in today's form, for the input that resumes from it; the keyword
  arguments are that input's facts (its `resume_facts()`: none for an input without earlier forms).

  A token store's state (`kind` 'store'): one saved before data.packing_fit packed next-fit and names no
  fit; one saved before sources were named by their manifest fingerprint holds the config's paths, which
  resume as the same stores (`sources` -> `portable_sources`).

  A streaming text state (`fingerprint_keys`: {fit: what today's fingerprint of the stream packed with
  that fit hashes}): its fingerprint in an earlier form (the sources' paths as written, with the
  tokenizer's sha256 or without it; and from before data.packing_fit, without the fit: next-fit) becomes
  today's of the same stream and fit; a state saved before phases continued an order read no rows before
  it (`rows_before` 0), and one saved before `process_count` was recorded is this run's.
  """
  out = dict(saved)
  if portable_sources is not None and out.get("kind") == "store":
    config = dict(out.get("config", {}))
    config.setdefault("packing_fit", "next")
    if config.get("sources") == list(sources):
      config["sources"] = list(portable_sources)
    out["config"] = config
  if fingerprint_keys is not None and out.get("kind") is None:
    out.setdefault("rows_before", 0)
    out.setdefault("process_count", process_count)
    if "fingerprint" in out:
      earlier = _earlier_fingerprints(fingerprint_keys, list(sources), list(eval_sources))
      out["fingerprint"] = earlier.get(out["fingerprint"], out["fingerprint"])
  return out


def _earlier_fingerprints(keys: dict, sources: list, eval_sources: list) -> dict:
  """{a streaming text state's fingerprint as earlier versions wrote it: today's}, for the stream whose
  fingerprint hashes keys[fit] when packed with `fit`."""
  without = lambda key, field: {k: v for k, v in key.items() if k != field}
  out = {}
  for fit, key in keys.items():
    forms = [key] + ([without(key, "packing_fit")] if fit == "next" else [])   # next-fit: also without a fit
    for form in forms:
      by_path = dict(form, sources=sources, eval_sources=eval_sources)
      for earlier in (form, by_path, without(by_path, "tokenizer")):
        out.setdefault(fingerprint.digest(earlier), fingerprint.digest(key))
  return out
