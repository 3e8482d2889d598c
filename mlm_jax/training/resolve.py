"""The one resolution step: a loaded config + the workdir -> `Resolved(user, config, tokenizer, objective)`.

A pure function: it reads files (the tokenizer, an init_from source's config.json) and writes none; what
must exist on disk first (the demo corpus, a trained tokenizer, a converted transformers folder) is made
by provision.py, which the binaries call first. The user's config comes back untouched (`user`); the
config the run uses (`config`) is the user's with what resolution derived over it (the tokenizer's
vocabulary size and ids, the platform's attention kernel and matmul, the prediction slots, an init_from
source's model), final, checked and frozen. WORKDIR/config.json keeps the two apart (workdir/files.py).
Everything a run derives is derived here, and the objective is looked up here, once.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
from absl import logging

from mlm_jax import paths
from mlm_jax.config import choices, curricula, derived as derived_lib, phases as phases_lib
from mlm_jax.data import specs
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.errors import ConfigError
from mlm_jax.model import attention, matmul
from mlm_jax.objectives import masking, registry
from mlm_jax.workdir import files as workdir_files, restore
from mlm_jax.training import time_budget

PRETRAINING, FINETUNING = "pretraining", "finetuning"   # config.kind


@dataclasses.dataclass(frozen=True)
class Resolved:
  config: ml_collections.FrozenConfigDict   # the user's config with the derived values over it: what the run reads
  tokenizer: Any                  # data/tokenizers' Tokenizer; None when compiling without one
  objective: type | None          # the pretraining objective's class; None for fine-tuning (its head is the task's)
  notes: tuple = ()               # what was assumed (resolve_for_compile)
  phases: tuple = ()              # config.phases parsed (config/phases.Phase); () for a run without
  phase_configs: tuple = ()       # each phase's resolved config; `config` is the last one's
  user: ml_collections.ConfigDict | None = None   # a copy of the config as the user gave it (None: `config`)

  @property
  def derived(self) -> dict:
    """What resolution derived: the fields of `config` the user's config does not hold, or holds otherwise."""
    return derived_lib.split(self.user, self.config) if self.user is not None else {}


def freeze(config: ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
  return ml_collections.FrozenConfigDict(config)


def _copy(config) -> ml_collections.ConfigDict:
  """An unlocked, editable copy (the loaded config stays as the user wrote it)."""
  return ml_collections.ConfigDict(config.to_dict())


def seq_len_of(config) -> tuple[str, int]:
  """(the key, its value) of a config's sequence length: data.seq_len, or a fine-tuning config's seq_len."""
  return ("data.seq_len", config.data.seq_len) if config.kind == PRETRAINING else ("seq_len", config.seq_len)


def check_positions(model_cfg, seq_len: int, where: str) -> None:
  """A learned-position model reads at most max_position_embeddings - position_offset tokens."""
  limit = model_cfg.max_position_embeddings - model_cfg.position_offset
  if model_cfg.positions == "learned" and seq_len > limit:
    raise ConfigError(f"{where}={seq_len}: the model has positions for {limit} tokens "
                      f"(model.max_position_embeddings={model_cfg.max_position_embeddings})")


def check(config: ml_collections.ConfigDict, objective: type | None = None) -> None:
  """Every choice, then the rules that tie fields together; one ConfigError naming the key(s).
  `objective`: a pretraining config's, whose own rules are checked too."""
  choices.check_config(config)
  t = config.train
  n = jax.process_count()
  for name in ("batch_size", "eval_batch_size"):
    if name in t and t[name] % n:
      raise ConfigError(f"train.{name}={t[name]} is not divisible by the {n} processes")
  accum = int(config.optimizer.grad_accum_steps)
  if accum < 1 or t.batch_size % accum:
    raise ConfigError(f"optimizer.grad_accum_steps={accum} must be >= 1 and divide train.batch_size={t.batch_size}")
  if config.kind == PRETRAINING:
    masking.check_config(config.masking, config.model.vocab_size)
    check_input(config, objective)
    objective.check(config)
  where, seq_len = seq_len_of(config)
  check_positions(config.model, seq_len, where)


def check_input(config: ml_collections.ConfigDict, objective: type) -> None:
  """Data schedules and sentence objectives read a token store: one line saying what to run otherwise."""
  curricula.data_phases(config.data)   # parses (one ConfigError per bad entry)
  store = bool(config.data.sources) and specs.is_store(config.data)
  pairs = objective.input_kind != "rows"   # sentence pairs
  what = ("data.mix_alpha_schedule / data.source_start_steps" if curricula.has_data_schedule(config.data)
          else f"objective={config.objective!r}" if pairs else "")
  if what and not store:
    raise ConfigError(f"{what} needs token-store sources (data.sources=('store:DIR',)): prepare the corpus "
                      "once with tools/prepare_data.py --doc_format=blank_line, then train from store:DIR")


def bind_platform(config: ml_collections.ConfigDict, platform: str, objective: type | None = None) -> str:
  """What depends on the platform the step runs on ('cpu', 'gpu', 'tpu': the mesh's, which for the
  AOT tool is not the host's): the attention implementation (`auto` -> splash / cudnn / xla), how
  matmuls are written (model.matmul `auto` -> f32_out / xla) and the number of prediction slots,
  written into `config` (resolution's own copy: the resolved config) so the jitted step uses them as they are.
  Returns why that implementation (also logged)."""
  _, seq_len = seq_len_of(config)
  packed = config.kind == PRETRAINING and config.data.packing == "segmented"   # rows that hold several documents
  requested = config.model.attention_impl
  config.model.attention_impl, why = attention.resolve_impl(config.model, platform, seq_len, packed_documents=packed)
  towers = objective.towers(config) if objective is not None else {}
  for name, tower in towers.items():   # other towers of the step run the same kernel with their own sizes
    tower.attention_impl = config.model.attention_impl
    try:
      attention.resolve_impl(tower, platform, seq_len, packed_documents=packed)
    except ConfigError as e:
      if requested != "auto":
        raise ConfigError(f"{e} (in {name})") from None
      config.model.attention_impl, why = "xla", f"xla, since {name} cannot use it: {e}"
  logging.info("attention: %s", why)
  config.model.matmul = matmul.resolve(config.model, platform)
  if warning := matmul.cpu_dtype_warning(config.model, platform):
    logging.warning("%s", warning)
  for tower in towers.values():
    tower.matmul = matmul.resolve(tower, platform)
  if objective is not None:
    masking.check_slots(config.masking, seq_len)
    config.masking.max_predictions = masking.max_predictions(config.masking, seq_len, platform)
  return why


# ------------------------------------------------------------------------------------------
# Pretraining
# ------------------------------------------------------------------------------------------
def _substitute_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """`{workdir}` in data paths means the run's directory (the demo keeps its corpus there)."""
  d = config.data
  d.sources = tuple(s.replace("{workdir}", workdir) for s in d.sources)
  d.eval_sources = tuple(s.replace("{workdir}", workdir) for s in d.eval_sources)
  d.tokenizer = d.tokenizer.replace("{workdir}", workdir)


def _bind_store_tokenizer(config: ml_collections.ConfigDict) -> None:
  """Without `data.tokenizer`, a token store's run uses the tokenizer the store carries."""
  if not config.data.tokenizer and config.data.sources and specs.is_store(config.data):
    from mlm_jax.data.store import loader   # token stores only: a text run never imports the store package
    config.data.tokenizer = loader.store_tokenizer_path(config.data)


def _pretraining_tokenizer(config: ml_collections.ConfigDict, workdir: str):
  """The tokenizer a settled config (see `settle`) names: `data.tokenizer` (its own, a token store's, an
  init_from source's) or, when none, WORKDIR/tokenizer/spm.model, which provisioning trains."""
  path = workdir_files.tokenizer_path(workdir, config)
  if paths.missing(path) and not config.data.tokenizer:
    raise ConfigError(f"{path}: no trained tokenizer (provision.pretraining trains one on data.sources first)")
  if paths.missing(path):
    raise ConfigError(f"data.tokenizer={path!r}: no such file or folder (expected a sentencepiece .model, a "
                      "vocab.txt, a tokenizer.json or a folder holding one)")
  return tokenizer_load.load(path)


def bind_masking_ids(masking_cfg: ml_collections.ConfigDict, tok) -> None:
  """The mask id and the ids masking never selects or samples, from the tokenizer."""
  masking_cfg.mask_id = tok.mask_id
  masking_cfg.special_ids = tuple(int(i) for i in tok.special_ids if i != tok.mask_id)


def bind_tokenizer(config: ml_collections.ConfigDict, tok) -> None:
  """Model vocabulary and masking ids come from the tokenizer; a mismatch is an error."""
  if config.model.vocab_size <= 0:
    config.model.vocab_size = tok.vocab_size
  bind_masking_ids(config.masking, tok)
  if config.model.vocab_size != tok.vocab_size:
    raise ConfigError(f"model.vocab_size={config.model.vocab_size} does not match the tokenizer "
                      f"{tok.model_path} ({tok.vocab_size} pieces)")


def settle(config: ml_collections.ConfigDict, workdir: str,
           overrides: dict | None = None) -> tuple[ml_collections.ConfigDict, type, list]:
  """(an editable copy of `config` with its sources, init_from / branch_from source and tokenizer path
  settled, the objective, the parsed phases): the part of resolution provisioning needs too (it trains a
  tokenizer only when the settled `data.tokenizer` is empty). Checks first what fails fast: choices, phases, the
  objective's own rules, source names. `overrides`: the command line's `--config.*` values (see
  bind_init_from)."""
  config = _copy(config)
  choices.check_config(config)   # a typo'd choice fails before minutes of tokenizer training
  phases = phases_lib.parse(config)   # and a bad phase
  if phases and time_budget.minutes(config.train) > 0:
    raise ConfigError("train.time_budget_minutes with config.phases: a budget decides the run's steps as it runs, "
                      "phases end at steps given in advance; give one")
  phases_lib.bind_token_lengths(config, phases)
  objective = registry.load(config.objective)
  _substitute_workdir(config, workdir)
  if config.init_from:
    bind_init_from(config, workdir, overrides)
  if config.get("branch_from"):
    if config.init_from:
      raise ConfigError("branch_from and init_from: give one (branch_from takes the whole state, init_from the weights)")
    from mlm_jax.workdir import branch
    source, step = branch.check(config.branch_from, workdir)
    config.branch_from = f"{source}:{step}"
  objective.check(config)   # e.g. ELECTRA's export rules, before the tokenizer is trained
  for field in ("sources", "eval_sources"):   # and a malformed or repeated source name
    specs.parse_named(config.data[field])
  _bind_store_tokenizer(config)
  return config, objective, phases


def resolve_pretraining(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None) -> Resolved:
  """For `mlm_jax.train`, after provision.pretraining; `config` is left as it is.

  `overrides`: the command line's `--config.*` values (see bind_init_from).
  """
  user = _copy(config)
  config, objective, phases = settle(config, workdir, overrides)
  tok = _pretraining_tokenizer(config, workdir)
  bind_tokenizer(config, tok)
  if phases:
    configs = resolve_phases(config, phases, jax.default_backend(), objective, workdir)
    return Resolved(configs[-1], tok, objective, phases=tuple(phases), phase_configs=configs, user=user)
  objective.bind(config)
  bind_platform(config, jax.default_backend(), objective)
  check(config, objective)
  return Resolved(freeze(config), tok, objective, user=user)


def resolve_phases(config: ml_collections.ConfigDict, phases: list, platform: str, objective: type,
                   workdir: str = "") -> tuple:
  """Each phase's config, bound and checked like a run's (its own attention kernel and prediction
  slots); all of them carry the run's length (the last phase's end) and the recorded phases."""
  out = []
  for k, phase in enumerate(phases):
    c = phases_lib.config_of(config, phases, k)
    c.train.steps = phases[-1].end
    if workdir:
      _substitute_workdir(c, workdir)
    objective.bind(c)
    try:
      bind_platform(c, platform, objective)
      check(c, objective)
    except ConfigError as e:
      raise ConfigError(f"phase {phase.name!r}: {e}") from None
    out.append(c)
  record = phases_lib.recorded(phases, out)
  for c in out:
    c.phases = record
  return tuple(freeze(c) for c in out)


def resolve_for_compile(config: ml_collections.ConfigDict, platform: str = "tpu") -> Resolved:
  """For compiling the step for `platform` without a tokenizer (the AOT tool, the benchmark); `notes`
  say what was assumed.

  The ids only pick which tokens masking may touch, so they change neither the memory nor the
  FLOPs of the step; the vocabulary size does, and must be given.
  """
  user, config, notes = _copy(config), _copy(config), []
  objective = registry.load(config.objective)
  v = config.model.vocab_size
  if v <= 0:
    raise ConfigError("model.vocab_size=0 means 'from the tokenizer' at train time; pass --config.model.vocab_size=N")
  if config.masking.get("mask_id", -1) < 0:
    config.masking.mask_id = v - 1
    notes.append(f"masking.mask_id unset: using {v - 1} (last id, XLM-R layout)")
  if not config.masking.get("special_ids", ()):
    config.masking.special_ids = (0, 1, 2, 3)
    notes.append("masking.special_ids unset: using (0, 1, 2, 3)")
  objective.bind(config)
  notes.append(f"attention: {bind_platform(config, platform, objective)}")
  check(config, objective)
  return Resolved(freeze(config), None, objective, tuple(notes), user=user)


# ------------------------------------------------------------------------------------------
# init_from: continue from a released checkpoint, a from_hf folder or a workdir
# ------------------------------------------------------------------------------------------
# Fields of `model` that stay the user's when continuing: how to run the model, not what it is.
# Every other model field is the source's.
RUN_MODEL_FIELDS = ("dtype", "param_dtype", "hidden_dropout", "attention_dropout", "remat", "attention_impl",
                    "scan_layers", "matmul")


def init_source(init_from: str, workdir: str) -> str:
  """The folder holding config.json + checkpoints: `init_from`, or for a transformers folder the
  WORKDIR/init_model that provisioning converted it into."""
  if not init_from:
    raise ConfigError("--init_from is required: a pretraining workdir, a from_hf folder or a transformers folder")
  if not is_transformers_folder(init_from):
    return init_from
  out = os.path.join(workdir, "init_model")
  if not os.path.exists(os.path.join(out, "config.json")):
    raise ConfigError(f"init_from={init_from!r} is a transformers folder not converted yet into {out} "
                      "(provisioning converts it, before resolution)")
  return out


def is_transformers_folder(init_from: str) -> bool:
  """True for a transformers model folder (its config.json has `model_type`), False for an mlm_jax run's."""
  path = os.path.join(init_from, "config.json")
  if not os.path.exists(path):
    raise ConfigError(f"init_from={init_from!r}: no config.json (expected a pretraining workdir, a from_hf "
                      "folder or a transformers model folder)")
  with open(path, encoding="utf-8") as f:
    return "model_type" in json.load(f)


def _same(a, b) -> bool:
  norm = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v
  return norm(a) == norm(b)


def bind_init_from(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None) -> None:
  """`init_from=DIR` is all it takes to continue: the model and the tokenizer are DIR's.

  Model fields other than RUN_MODEL_FIELDS, and the tokenizer, are replaced by the source's; a value
  the config file set is replaced silently, but a command-line override (`overrides`, as
  config_flags.get_override_values gives them: {"model.hidden_size": 512}) that contradicts the source
  is an error, since the user asked for a model the checkpoint is not.
  """
  overrides = overrides or {}
  given = config.init_from
  source = init_source(given, workdir)
  src = workdir_files.config_at(source)   # the newest checkpoint's, which init_from restores
  if "model" not in src:
    raise ConfigError(f"init_from={given!r}: its config.json has no model section")
  taken = []
  for key, value in src.model.items():
    if key in RUN_MODEL_FIELDS or key not in config.model:
      continue
    flag = f"model.{key}"
    if flag in overrides and not _same(overrides[flag], value):
      raise ConfigError(f"--config.{flag}={overrides[flag]} contradicts init_from={given} ({flag}={value}); "
                        "drop the flag: the architecture comes from the checkpoint")
    if not _same(config.model[key], value):
      taken.append(key)
    config.model[key] = value
  config.init_from = source
  tok = workdir_files.tokenizer_path(source, src)
  if not paths.missing(tok):
    wanted = overrides.get("data.tokenizer")   # the same tokenizer (a copy, its folder) is no contradiction
    if wanted and tokenizer_load.sha256_of(wanted) != tokenizer_load.sha256_of(tok):
      raise ConfigError(f"--config.data.tokenizer={wanted} contradicts init_from={given} (its tokenizer is {tok})")
    config.data.tokenizer = tok
  logging.info("init_from %s: model (%d fields differ from the config file's) and tokenizer %s from %s",
               given, len(taken), config.data.tokenizer or "(none found)", source)


# ------------------------------------------------------------------------------------------
# Fine-tuning
# ------------------------------------------------------------------------------------------
def resolve_finetuning(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None) -> Resolved:
  """For `mlm_jax.finetune`, after provision.finetuning: a config with the source's `model` section, and its
  tokenizer; `config` is left as it is.

  The model is the source's (on top of today's defaults) with the fine-tuning dropout overrides;
  the tokenizer is the source's unless `tokenizer` is set; `init_from` becomes the source folder.
  """
  from mlm_jax.config.defaults import model_defaults
  user, config = _copy(config), _copy(config)
  choices.check_config(config)
  source = init_source(init_from or config.init_from, workdir)
  source_cfg = workdir_files.config_at(source)
  model = model_defaults()
  model.update(restore.encoder_of(source_cfg)[1].to_dict())   # ELECTRA: the discriminator
  if config.hidden_dropout >= 0:
    model.hidden_dropout = config.hidden_dropout
  if config.attention_dropout >= 0:
    model.attention_dropout = config.attention_dropout
  config.model = model
  config.init_from = source
  path = config.tokenizer or workdir_files.tokenizer_path(source, source_cfg)
  if paths.missing(path):
    raise ConfigError(f"{source}: no tokenizer at {path}; pass --config.tokenizer=PATH (a transformers folder "
                      "needs its spm.model, sentencepiece.bpe.model, tokenizer.json, vocab.txt or vocab.json)")
  config.tokenizer = path
  tok = workdir_files.load_tokenizer(path, model.vocab_size)
  o = config.optimizer
  if not o.warmup_steps:
    o.warmup_steps = int(round(o.get("warmup_fraction", 0.0) * config.train.steps))
  bind_platform(config, jax.default_backend())
  check(config)
  return Resolved(freeze(config), tok, None, user=user)
