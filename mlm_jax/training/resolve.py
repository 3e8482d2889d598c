"""The one resolution step: a loaded config + the workdir (+ the tokenizer, the init_from folder) ->
the final, validated, frozen config that the run uses and writes as WORKDIR/config.json.

Everything a run derives is derived here and nowhere else: `{workdir}` in paths, the vocabulary
size and masking ids from the tokenizer, a fine-tuning model from its source folder, warmup steps
from a warmup fraction. Then every choice is checked (choices.py) with the cross-field rules below,
and the config is frozen, so nothing edits it afterwards.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections
from absl import logging

from mlm_jax.model import attention, sharding
from mlm_jax.config import choices
from mlm_jax.objectives import masking
from mlm_jax.workdir import files as workdir_lib
from mlm_jax.errors import ConfigError
from mlm_jax.objectives import registry


def freeze(config: ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
  return ml_collections.FrozenConfigDict(config)


def _copy(config) -> ml_collections.ConfigDict:
  """An unlocked, editable copy (the loaded config stays as the user wrote it)."""
  return ml_collections.ConfigDict(config.to_dict())


def check(config: ml_collections.ConfigDict) -> None:
  """Every choice, then the rules that tie fields together; one ConfigError naming the key(s)."""
  choices.check_config(config)
  t = config.train
  n = jax.process_count()
  for name in ("batch_size", "eval_batch_size"):
    if name in t and t[name] % n:
      raise ConfigError(f"train.{name}={t[name]} is not divisible by the {n} processes")
  accum = int(config.optimizer.grad_accum_steps)
  if accum < 1 or t.batch_size % accum:
    raise ConfigError(f"optimizer.grad_accum_steps={accum} must be >= 1 and divide train.batch_size={t.batch_size}")
  if "masking" in config:
    masking.check_config(config.masking, config.model.vocab_size)
  if "data" in config:
    _check_curricula(config)
  if "masking" in config:   # a pretraining config: its objective's own rules
    registry.for_config(config).check(config)
  m = config.model
  seq_len = config.data.seq_len if "data" in config else config.seq_len
  limit = m.max_position_embeddings - m.position_offset
  if m.positions == "learned" and seq_len > limit:
    where = "data.seq_len" if "data" in config else "seq_len"
    raise ConfigError(f"{where}={seq_len}: the model has positions for {limit} tokens "
                      f"(model.max_position_embeddings={m.max_position_embeddings})")


def _check_curricula(config: ml_collections.ConfigDict) -> None:
  """Data schedules and sentence objectives read a token store: one line saying what to run otherwise."""
  from mlm_jax.config import curricula as schedules
  from mlm_jax.data.store import loader as store_pipeline
  schedules.data_phases(config.data)   # parses (one ConfigError per bad entry)
  store = bool(config.data.sources) and store_pipeline.is_store(config.data)
  pairs = "masking" in config and registry.for_config(config).input_kind != "rows"   # sentence pairs
  what = ("data.mix_alpha_schedule / data.source_start_steps" if schedules.has_data_schedule(config.data)
          else f"objective={config.objective!r}" if pairs else "")
  if what and not store:
    raise ConfigError(f"{what} needs token-store sources (data.sources=('store:DIR',)): prepare the corpus "
                      "once with tools/prepare_data.py --doc_format=blank_line, then train from store:DIR")


def bind_platform(config: ml_collections.ConfigDict, platform: str) -> str:
  """What depends on the platform the step runs on ('cpu', 'gpu', 'tpu': the mesh's, which for the
  AOT tool is not the host's): the attention implementation (`auto` -> splash / cudnn / xla) and the
  number of prediction slots, written into the config so the jitted step uses them as they are.
  Returns why that implementation (also logged)."""
  seq_len = config.data.seq_len if "data" in config else config.seq_len
  packed = "data" in config and config.data.packing == "segmented"   # rows that hold several documents
  requested = config.model.attention_impl or "auto"
  config.model.attention_impl, why = attention.resolve_impl(config.model, platform, seq_len, packed_documents=packed)
  towers = registry.for_config(config).towers(config) if "masking" in config else {}
  for name, tower in towers.items():   # other towers of the step run the same kernel with their own sizes
    tower.attention_impl = config.model.attention_impl
    try:
      attention.resolve_impl(tower, platform, seq_len, packed_documents=packed)
    except ConfigError as e:
      if requested != "auto":
        raise ConfigError(f"{e} (in {name})") from None
      config.model.attention_impl, why = "xla", f"xla, since {name} cannot use it: {e}"
  logging.info("attention: %s", why)
  if "masking" in config:
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


def _pretraining_tokenizer(config: ml_collections.ConfigDict, workdir: str):
  """`data.tokenizer`, the one a token store carries, or one trained into WORKDIR/tokenizer (once)."""
  from mlm_jax import runtime
  from mlm_jax.data.store import loader as store_pipeline
  from mlm_jax.data.tokenizers import load as tok_lib
  from mlm_jax.data.tokenizers import spm_training as tok_train
  if not config.data.tokenizer:
    config.data.tokenizer = store_pipeline.store_tokenizer_path(config.data)
  path = config.data.tokenizer
  if not path:
    path = os.path.join(workdir, "tokenizer", "spm.model")
    if not os.path.exists(path) and jax.process_index() == 0:
      t = config.tokenizer
      logging.info("training a %d-piece %s tokenizer on %s", t.vocab_size, t.model_type, config.data.sources)
      tok_train.train(list(config.data.sources), path[:-len(".model")], vocab_size=t.vocab_size, layout=t.layout,
                      model_type=t.model_type, alpha=t.alpha, input_sentence_size=t.input_sentence_size,
                      seed=config.seed, log=logging.info, spm_log="" if runtime.quiet() else None)
    sharding.sync_processes("tokenizer")
  elif not os.path.exists(path) and "://" not in path:
    raise ConfigError(f"data.tokenizer={path!r}: no such file or folder (expected a sentencepiece .model, a "
                      "vocab.txt, a tokenizer.json or a folder holding one)")
  return tok_lib.load(path)


def bind_tokenizer(config: ml_collections.ConfigDict, tok) -> None:
  """Model vocabulary and masking ids come from the tokenizer; a mismatch is an error."""
  if config.model.vocab_size <= 0:
    config.model.vocab_size = tok.vocab_size
  config.masking.mask_id = tok.mask_id
  config.masking.special_ids = tuple(int(i) for i in tok.special_ids if i != tok.mask_id)
  if config.model.vocab_size != tok.vocab_size:
    raise ConfigError(f"model.vocab_size={config.model.vocab_size} does not match the tokenizer "
                      f"{tok.model_path} ({tok.vocab_size} pieces)")


def bind_objective(config: ml_collections.ConfigDict) -> None:
  """What the objective implies (NSP / SOP: BERT's pooler and a 2-way sentence head on it)."""
  registry.for_config(config).bind(config)


def resolve_pretraining(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None):
  """(frozen config, tokenizer) for `mlm_jax.train`; writes the demo corpus / trains the tokenizer once.

  `overrides`: the command line's `--config.*` values (see bind_init_from).
  """
  config = _copy(config)
  choices.check_config(config)   # a typo'd choice fails before minutes of tokenizer training
  _substitute_workdir(config, workdir)
  if config.init_from:
    bind_init_from(config, workdir, overrides)
  registry.for_config(config).check(config)   # e.g. ELECTRA's export rules, before the tokenizer is trained
  if config.demo_corpus:
    from mlm_jax.data import demo_corpus
    if jax.process_index() == 0:
      demo_corpus.write(os.path.join(workdir, "demo_corpus"))
    sharding.sync_processes("demo_corpus")
  tok = _pretraining_tokenizer(config, workdir)
  bind_tokenizer(config, tok)
  bind_objective(config)
  bind_platform(config, jax.default_backend())
  check(config)
  return freeze(config), tok


def resolve_for_compile(config: ml_collections.ConfigDict, platform: str = "tpu"):
  """(frozen config, notes) for compiling the step for `platform` without a tokenizer (the AOT tool).

  The ids only pick which tokens masking may touch, so they change neither the memory nor the
  FLOPs of the step; the vocabulary size does, and must be given.
  """
  config, notes = _copy(config), []
  v = config.model.vocab_size
  if v <= 0:
    raise ConfigError("model.vocab_size=0 means 'from the tokenizer' at train time; pass --config.model.vocab_size=N")
  if config.masking.mask_id < 0:
    config.masking.mask_id = v - 1
    notes.append(f"masking.mask_id unset: using {v - 1} (last id, XLM-R layout)")
  if not config.masking.special_ids:
    config.masking.special_ids = (0, 1, 2, 3)
    notes.append("masking.special_ids unset: using (0, 1, 2, 3)")
  bind_objective(config)
  bind_platform(config, platform)
  notes.append(f"attention: {config.model.attention_impl}")
  check(config)
  return freeze(config), notes


# ------------------------------------------------------------------------------------------
# init_from: continue from a released checkpoint, a from_hf folder or a workdir
# ------------------------------------------------------------------------------------------
# Fields of `model` that stay the user's when continuing: how to run the model, not what it is.
# Every other model field is the source's.
RUN_MODEL_FIELDS = ("dtype", "param_dtype", "hidden_dropout", "attention_dropout", "remat", "attention_impl",
                    "scan_layers")


def init_source(init_from: str, workdir: str) -> str:
  """The folder holding config.json + checkpoints; a transformers folder is converted into WORKDIR/init_model once."""
  from mlm_jax.convert import folders as cio
  if not init_from:
    raise ConfigError("--init_from is required: a pretraining workdir, a from_hf folder or a transformers folder")
  path = os.path.join(init_from, "config.json")
  if not os.path.exists(path):
    raise ConfigError(f"init_from={init_from!r}: no config.json (expected a pretraining workdir, a from_hf "
                      "folder or a transformers model folder)")
  with open(path, encoding="utf-8") as f:
    raw = json.load(f)
  if "model_type" not in raw:
    return init_from
  out = os.path.join(workdir, "init_model")   # a transformers folder: convert it once, with the converter
  if not os.path.exists(os.path.join(out, "config.json")):
    if jax.process_index() == 0:
      summary = cio.from_hf(init_from, out, overwrite=True)
      logging.info("converted %s (%s) into %s", init_from, summary["arch"], out)
      if summary["fresh_head"]:
        logging.warning("%s has no MLM head (a base or sentence-transformers model): the head is freshly "
                        "initialized", init_from)
    sharding.sync_processes("from_hf")
  return out


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
  src = workdir_lib.read_config(source)
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
  tok = workdir_lib.tokenizer_path(source, src)
  if os.path.exists(tok) or "://" in tok:
    from mlm_jax.data.tokenizers import load as tok_lib
    wanted = overrides.get("data.tokenizer")   # the same tokenizer (a copy, its folder) is no contradiction
    if wanted and tok_lib.sha256_of(wanted) != tok_lib.sha256_of(tok):
      raise ConfigError(f"--config.data.tokenizer={wanted} contradicts init_from={given} (its tokenizer is {tok})")
    config.data.tokenizer = tok
  logging.info("init_from %s: model (%d fields differ from the config file's) and tokenizer %s from %s",
               given, len(taken), config.data.tokenizer or "(none found)", source)


# ------------------------------------------------------------------------------------------
# Fine-tuning
# ------------------------------------------------------------------------------------------
def resolve_finetuning(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None):
  """(frozen config with a `model` section, tokenizer) for `mlm_jax.finetune`.

  The model is the source's (on top of today's defaults) with the fine-tuning dropout overrides;
  the tokenizer is the source's unless `tokenizer` is set; `init_from` becomes the source folder.
  """
  from mlm_jax.config.defaults import model_defaults
  config = _copy(config)
  choices.check_config(config)
  source = init_source(init_from or config.init_from, workdir)
  source_cfg = workdir_lib.read_config(source)
  model = model_defaults()
  model.update(workdir_lib.encoder_of(source_cfg)[1].to_dict())   # ELECTRA: the discriminator
  if config.hidden_dropout >= 0:
    model.hidden_dropout = config.hidden_dropout
  if config.attention_dropout >= 0:
    model.attention_dropout = config.attention_dropout
  config.model = model
  config.init_from = source
  path = config.tokenizer or workdir_lib.tokenizer_path(source, source_cfg)
  if not os.path.exists(path) and "://" not in path:
    raise ConfigError(f"{source}: no tokenizer at {path}; pass --config.tokenizer=PATH (a transformers folder "
                      "needs its spm.model, sentencepiece.bpe.model, tokenizer.json, vocab.txt or vocab.json)")
  config.tokenizer = path
  tok = workdir_lib.load_tokenizer(path, model.vocab_size)
  o = config.optimizer
  if not o.warmup_steps:
    o.warmup_steps = int(round(o.get("warmup_fraction", 0.0) * config.train.steps))
  bind_platform(config, jax.default_backend())
  check(config)
  return freeze(config), tok
