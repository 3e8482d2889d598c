"""A workdir's files besides its checkpoints: creating it, writing and reading config.json, finding and
loading its tokenizer.

config.json holds {"version", "config": the user's config, "derived": what resolution derived}
(config/derived.py). It is read here, once: upgraded from any earlier layout by workdir/migrate.py (fields
that later versions added get the value that older runs meant) and merged back into the resolved config,
so every other module can read any field of any config.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections

from mlm_jax import paths
from mlm_jax.config import derived as derived_lib
from mlm_jax.errors import CheckpointError
from mlm_jax.workdir import migrate


def make_workdir(workdir: str) -> str:
  """The absolute workdir (local, or gs:// and the like), created if missing. A folder holding a
  config.json that no mlm_jax run wrote (a Hugging Face model folder, say) is refused, untouched."""
  workdir = paths.absolute(workdir)
  check_is_run(workdir)
  paths.makedirs(workdir)
  return workdir


# Sections every config.json of a run (training binaries, from_hf) has; a Hugging Face config has none.
RUN_KINDS = ("pretraining", "finetuning")


def check_is_run(workdir: str) -> None:
  """Raise CheckpointError when WORKDIR/config.json exists but is not an mlm_jax run's config."""
  path = os.path.join(workdir, "config.json")
  if not paths.exists(path):
    return
  with paths.open_file(path, "r") as f:
    text = f.read()
  try:
    config = json.loads(text)
  except ValueError:
    config = None
  if isinstance(config, dict) and migrate.version_of(config) > 1:   # the resolved config it records
    config = derived_lib.merge(config["config"], config.get("derived") or {})
  if isinstance(config, dict) and isinstance(config.get("model"), dict) and (
      config.get("kind") in RUN_KINDS or isinstance(config.get("train"), dict) or isinstance(config.get("task"), dict)):
    return
  looks = (f" (a Hugging Face model's: model_type={config['model_type']!r})"
           if isinstance(config, dict) and "model_type" in config else "")
  raise CheckpointError(f"--workdir {workdir}: its config.json is not an mlm_jax run's{looks}; it is left as it "
                        "is: give a new folder or an mlm_jax run's workdir")


def write_config(config: ml_collections.ConfigDict, workdir: str,
                 user: ml_collections.ConfigDict | None = None) -> None:
  """WORKDIR/config.json: the user's config and what resolution derived from it (the fields of the resolved
  `config` that differ), apart; written once by process 0 before the first step. `user` None: `config`
  is recorded as it is, nothing derived (a converted or merged model's)."""
  user = config if user is None else user
  record = {"version": migrate.VERSION, "config": derived_lib.as_json(user),
            "derived": derived_lib.split(user, config)}
  if jax.process_index() == 0:
    with paths.open_file(os.path.join(workdir, "config.json"), "w") as f:
      f.write(json.dumps(record, indent=2, sort_keys=True))


def _for_this_host(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The platform's choices undone: a model built from a config.json here (inference, conversion,
  fine-tuning) picks the implementation of this host's platform again."""
  if "model" in config:
    if config.model.get("attention_impl") in ("splash", "cudnn"):   # resolved for the accelerator that trained it
      config.model.attention_impl = "auto"
    if config.model.get("matmul") == "f32_out":   # likewise: CPU's choice for a bfloat16 model
      config.model.matmul = "auto"
  return config


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json (written by the training binaries or by `from_hf`) as the resolved config, migrated.
  For the model of a checkpoint, `config_at`: in a run in phases these sections are the last phase's."""
  return _for_this_host(_read_json(workdir))


def config_at(workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """The config that trained WORKDIR's checkpoint `step` (None: the newest), migrated: in a run in phases
  the config of the phase that step belongs to (its RoPE theta, masking, sequence length), since
  config.json's sections are the last phase's. Every reader of a checkpoint's model takes its config
  from here: to_hf, init_from, fine-tuning and mlm_jax.downstream, fill-mask, merging, evaluation."""
  from mlm_jax.config import phases as phases_lib
  from mlm_jax.workdir import checkpoints
  config = _read_json(workdir)
  if config.get("phases"):
    step = checkpoints.newest_step(workdir) if step is None else step
    if step is not None:
      config = phases_lib.at_step(config, int(step))
  return _for_this_host(config)


def _read_json(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config config.json records: the user's with the derived values over it."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isdir(workdir):
    raise CheckpointError(f"workdir {workdir}: no such directory")
  if not os.path.exists(path):
    raise CheckpointError(f"{path}: missing (not a workdir of mlm_jax.train or a from_hf output)")
  with open(path, encoding="utf-8") as f:
    try:
      raw = json.load(f)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  return resolved_of(raw, path)


def resolved_of(raw: dict, where: str = "config.json") -> ml_collections.ConfigDict:
  """The resolved config a config.json's contents (any version) record: the user's with the derived over it."""
  record = migrate.config_json(raw, where)
  return ml_collections.ConfigDict(derived_lib.merge(record["config"], record["derived"]))


def tokenizer_path(workdir: str, config: ml_collections.ConfigDict) -> str:
  """The run's tokenizer: `data.tokenizer`, or the sentencepiece model the run trained into WORKDIR/tokenizer."""
  path = config.data.get("tokenizer", "") if config.kind == "pretraining" else ""
  return path or os.path.join(workdir, "tokenizer", "spm.model")


def load_tokenizer(path: str, vocab_size: int | None = None):
  """The tokenizer at `path`, checked against the model's vocabulary size."""
  from mlm_jax.data.tokenizers import load as tokenizer_load
  if paths.missing(path):
    raise CheckpointError(f"tokenizer {path}: missing")
  tok = tokenizer_load.load(path)
  if vocab_size is not None and tok.vocab_size != vocab_size:
    raise CheckpointError(f"vocab size mismatch: the model has vocab_size={vocab_size} but the tokenizer "
                          f"{path} has {tok.vocab_size} pieces")
  return tok
