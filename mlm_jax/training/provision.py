"""The one step with side effects before resolution: what a run needs on disk before its config can be
resolved (training/resolve.py, which only reads), each made once by process 0 while the other processes
wait: the demo corpus, a tokenizer trained on the corpus, a transformers folder converted for `init_from`.
The binaries call `pretraining` / `finetuning` first, then resolve."""
from __future__ import annotations

import os

import ml_collections
from absl import logging

from mlm_jax import runtime
from mlm_jax.config import choices, phases as phases_lib
from mlm_jax.errors import ConfigError
from mlm_jax.training import resolve, time_budget


def pretraining(config: ml_collections.ConfigDict, workdir: str, overrides: dict | None = None) -> None:
  """Everything resolve.resolve_pretraining(config, workdir, overrides) reads: the init_from source converted,
  the demo corpus written, the tokenizer trained, each unless it exists. A config resolution would refuse
  (a bad choice or phase, an objective's own rule) is refused before anything is written."""
  choices.check_config(config)
  phases_lib.parse(config)
  if config.init_from:
    import_transformers(config.init_from, workdir)
  settled, _, _ = resolve.settle(config, workdir, overrides)
  if config.demo_corpus:
    write_demo_corpus(workdir)
  if not settled.data.tokenizer:
    trained_tokenizer(settled, workdir)


def finetuning(config: ml_collections.ConfigDict, workdir: str, init_from: str | None = None) -> None:
  """Everything resolve.resolve_finetuning(config, workdir, init_from) reads: the source converted when it
  is a transformers folder. A time budget is refused here, before any conversion: it fixes a pretraining run's
  steps (training/time_budget.py); fine-tuning ends at train.steps and keeps its best checkpoint."""
  choices.check_config(config)
  if time_budget.minutes(config.train) > 0:
    raise ConfigError("train.time_budget_minutes: a budget fixes the steps of a pretraining run without "
                      "config.phases; give train.steps for fine-tuning instead")
  import_transformers(init_from or config.init_from, workdir)


def write_demo_corpus(workdir: str) -> str:
  """WORKDIR/demo_corpus (Python's own documentation as text), and demo_corpus/topics/ (its language
  reference part alone: the decay source of configs/demo.py:phases)."""
  from mlm_jax.data import demo_corpus
  out = os.path.join(workdir, "demo_corpus")

  def write():
    demo_corpus.write(out)
    demo_corpus.write_topics(os.path.join(out, "topics"))

  runtime.first_process_then_all("demo_corpus", write)
  return out


def trained_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> str:
  """WORKDIR/tokenizer/spm.model, trained on `data.sources` with `config.tokenizer` unless it exists."""
  path = os.path.join(workdir, "tokenizer", "spm.model")

  def train():
    if os.path.exists(path):
      return
    from mlm_jax.data.tokenizers import spm_training
    t = config.tokenizer
    logging.info("training a %d-piece %s tokenizer on %s", t.vocab_size, t.model_type, config.data.sources)
    spm_training.train(list(config.data.sources), path[:-len(".model")], vocab_size=t.vocab_size, layout=t.layout,
                       model_type=t.model_type, alpha=t.alpha, input_sentence_size=t.input_sentence_size,
                       seed=config.seed, log=logging.info, spm_log="" if runtime.quiet() else None)

  runtime.first_process_then_all("tokenizer", train)
  return path


def import_transformers(init_from: str, workdir: str) -> str:
  """The folder holding config.json + checkpoints (resolve.init_source); a transformers folder is converted
  into WORKDIR/init_model once."""
  if not init_from or not resolve.is_transformers_folder(init_from):
    return resolve.init_source(init_from, workdir)
  out = os.path.join(workdir, "init_model")

  def convert():
    if os.path.exists(os.path.join(out, "config.json")):
      return
    from mlm_jax.convert import folders
    summary = folders.from_hf(init_from, out, overwrite=True)
    logging.info("converted %s (%s) into %s", init_from, summary["arch"], out)
    if summary["fresh_head"]:
      logging.warning("%s has no MLM head (a base or sentence-transformers model): the head is freshly "
                      "initialized", init_from)

  runtime.first_process_then_all("from_hf", convert)
  return out
