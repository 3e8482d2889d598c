"""Every config field that takes one of a fixed set of values, and the one check that names them.

training/resolve.py checks a whole config here before any work starts, and a module used as a library
checks its fields here too, so an unknown value is always the same one-line ConfigError.
"""
from __future__ import annotations

from mlm_jax.errors import ConfigError

CHOICES = {
    "model.positions": ("learned", "rotary"),
    "model.norm": ("post", "pre"),
    "model.mlp": ("gelu", "geglu"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.remat": ("none", "full", "dots"),
    "model.attention_impl": ("auto", "xla", "splash", "cudnn"),
    "model.matmul": ("auto", "xla", "f32_out"),
    "masking.mode": ("token", "whole_word", "span", "span_uniform"),
    "optimizer.name": ("adamw", "lamb"),
    "optimizer.schedule": ("linear", "cosine", "constant", "wsd"),
    "optimizer.decay_shape": ("linear", "cosine", "1-sqrt"),
    "masking.mask_rate_schedule_mode": ("constant", "linear"),
    "kind": ("pretraining", "finetuning"),
    "train.nonfinite": ("skip", "stop"),
    "train.on_corrupt_checkpoint": ("fallback", "refuse"),
    "data.doc_format": ("line", "blank_line"),
    "data.packing": ("segmented", "concat"),
    "data.packing_fit": ("best", "next"),
    "data.per_host": ("shard", "slice"),
    "tokenizer.model_type": ("unigram", "bpe"),
    "tokenizer.layout": ("xlmr", "bert"),
    "task.kind": ("classification", "regression", "token", "qa"),
    "task.format": ("tsv", "csv", "jsonl", "lines", "trec", "conllu"),
}


def check(key: str, value) -> None:
  """Raise a ConfigError naming `key`, `value` and the allowed values when `value` is not one of them."""
  allowed = CHOICES[key]
  if value not in allowed:
    raise ConfigError(f"{key}={value!r}: expected one of {', '.join(repr(a) for a in allowed)}")


def check_config(config) -> None:
  """Check every choice field that `config` has (pretraining and fine-tuning configs alike)."""
  for key in CHOICES:
    section, _, field = key.rpartition(".")
    if not section:
      if key in config:
        check(key, config[key])
    elif section in config and field in config[section]:
      check(key, config[section][field])
