"""What a run needs on disk before its config can be resolved, each made once by process 0 while the
other processes wait: the demo corpus, a tokenizer trained on the corpus, a transformers folder
converted for `init_from`."""
from __future__ import annotations

import json
import os

import ml_collections
from absl import logging

from mlm_jax import runtime
from mlm_jax.errors import ConfigError


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


def init_source(init_from: str, workdir: str) -> str:
  """The folder holding config.json + checkpoints; a transformers folder is converted into WORKDIR/init_model once."""
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
