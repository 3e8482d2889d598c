"""The objectives `config.objective` may name: name -> "module:attr" of its description class
(interface.Description), and the one check of a name.

Objectives are imported when asked for. Adding one to the package is one line below; one defined
elsewhere needs none: `--config.objective=my_package.my_module:MyObjective` (config.json keeps it).
A config.json read back (`for_config`) names a registry objective, or a "module:Class" whose module
defines that class at its top level (read from its source before it is imported) and whose class has
the objective interface, its description's and its step's (checked before anything of it is called): a file
names no other code to run.
"""
from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util

from mlm_jax.errors import ConfigError

OBJECTIVES = {
    "mlm": "mlm_jax.objectives.mlm:MLM",
    "mlm+nsp": "mlm_jax.objectives.sentence:NextSentence",   # BERT's next-sentence prediction
    "mlm+sop": "mlm_jax.objectives.sentence:SentenceOrder",  # ALBERT's sentence-order prediction
    "electra": "mlm_jax.objectives.electra:Electra",
    "gpt_bert": "mlm_jax.objectives.gpt_bert:GptBert",   # masked next-token prediction + causal rows, one head
}
DEFAULT = "mlm"


def is_spec(value) -> bool:
  """Whether `value` names an objective by "module:attr" rather than by a registry name."""
  return isinstance(value, str) and ":" in value


def load(name: str):
  """The objective's description class for a registry name or a "module:attr" string."""
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
  """The objective's description class of a config read from a file (config.json; `objective`, default 'mlm')."""
  name = config.get("objective", DEFAULT)
  if not is_spec(name):
    return load(name)
  module, _, attr = name.partition(":")
  why = _not_a_class_in_source(module, attr)
  if why:
    raise ConfigError(f"config.json objective={name!r}: {why}; a config.json may name one of "
                      f"{', '.join(OBJECTIVES)} or 'module:Class' of an objective class")
  cls = load(name)
  missing = [m for m in _DESCRIPTION if not callable(getattr(cls, m, None))] if isinstance(cls, type) else ["a class"]
  if not missing:
    missing = [f"step.{m}" for m in _STEP if not callable(getattr(cls.step, m, None))]
  if missing:
    raise ConfigError(f"config.json objective={name!r}: not an objective class (it lacks {', '.join(missing)})")
  return cls


# What an objective class has (interface.Description, and its step's interface.Step), checked on a class a
# file names before it is used.
_DESCRIPTION = ("bind", "check", "towers", "batch_features", "flops_per_token", "make_model", "encoder",
                "masked_lm", "step")
_STEP = ("prepare", "loss_sums", "evaluate", "summarize", "console")


def _not_a_class_in_source(module: str, attr: str) -> str:
  """'' if `module`'s source (found without importing anything) defines class `attr` at its top
  level; else why not."""
  spec, path = None, None
  for i, part in enumerate(module.split(".")):
    if not part.isidentifier():
      return f"{module!r} is not a module name"
    try:   # a top-level name is found by every finder without running it; below it, in its package's folders
      spec = importlib.util.find_spec(part) if i == 0 else importlib.machinery.PathFinder.find_spec(part, path)
    except (ImportError, ValueError):
      spec = None
    if spec is None:
      return f"no module {'.'.join(module.split('.')[:i + 1])} is installed"
    path = spec.submodule_search_locations
  origin = spec.origin if spec is not None else None
  if not origin or not origin.endswith(".py"):
    return f"{module} has no Python source to read"
  try:
    with open(origin, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, ValueError) as e:
    return f"{origin} cannot be read ({type(e).__name__})"
  if not any(isinstance(n, ast.ClassDef) and n.name == attr for n in tree.body):
    return f"{module} defines no class {attr}"
  return ""
