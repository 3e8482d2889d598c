"""The objectives `config.objective` may name: name -> "module:attr" of the class, and the one check of a name.

Objectives are imported when asked for. Adding one to the package is one line below; one defined
elsewhere needs none: `--config.objective=my_package.my_module:MyObjective` (config.json keeps it).
"""
from __future__ import annotations

import importlib

from mlm_jax.errors import ConfigError

OBJECTIVES = {
    "mlm": "mlm_jax.objectives.mlm:MLM",
    "mlm+nsp": "mlm_jax.objectives.sentence:NextSentence",   # BERT's next-sentence prediction
    "mlm+sop": "mlm_jax.objectives.sentence:SentenceOrder",  # ALBERT's sentence-order prediction
    "electra": "mlm_jax.objectives.electra:Electra",
}
DEFAULT = "mlm"


def is_spec(value) -> bool:
  """Whether `value` names an objective by "module:attr" rather than by a registry name."""
  return isinstance(value, str) and ":" in value


def load(name: str):
  """The objective class for a registry name or a "module:attr" string."""
  spec = name if is_spec(name) else OBJECTIVES.get(name)
  if spec is None:
    raise ConfigError(f"objective={name!r}: expected one of {', '.join(repr(n) for n in OBJECTIVES)} or "
                      "'module:Class' of an objective defined elsewhere")
  module, _, attr = spec.partition(":")
  try:
    return getattr(importlib.import_module(module), attr)
  except ImportError as e:
    raise ConfigError(f"objective={name!r}: cannot import {module} ({e})") from None
  except AttributeError:
    raise ConfigError(f"objective={name!r}: {module} has no {attr}") from None


def for_config(config):
  """The objective class of a pretraining config (`config.objective`, default 'mlm')."""
  return load(config.get("objective", DEFAULT))
