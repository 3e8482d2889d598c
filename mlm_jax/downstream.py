"""Downstream suite binary: python -m mlm_jax.downstream --init_from=DIR [--fast] [--seeds=N] [--tasks=a,b]

Fine-tunes DIR (a pretraining workdir, a `convert_checkpoint.py from_hf` folder or a transformers
folder) on every task in ../shared/data/downstream with the budgets of configs/finetune/*.py
(`--fast`: their `:fast` budgets and one seed), N seeds each, and prints one table: per task its
standard metric, mean ± std over seeds, the average over tasks, and zero-shot cross-lingual columns
(fine-tuned on English, scored in every other language the task has). OUT/downstream.json holds the
same, OUT/TASK/seedN the runs; a re-run skips what is finished. The tasks, splits and model
selection: mlm_jax/tasks/suite.py; the table: mlm_jax/tasks/suite_report.py.
"""
from __future__ import annotations

from mlm_jax import runtime

runtime.configure()   # before jax and tensorflow are imported: platform and log levels

import ast  # noqa: E402
import os  # noqa: E402

from absl import app, flags  # noqa: E402

from mlm_jax.errors import ConfigError  # noqa: E402
from mlm_jax.tasks import suite  # noqa: E402

_INIT_FROM = flags.DEFINE_string("init_from", None, "Pretraining workdir, from_hf folder or transformers folder.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Output folder (default: INIT_FROM/downstream_MODE[_random_init]).")
_FAST = flags.DEFINE_bool("fast", False, "The configs' fast budgets (configs/finetune/TASK.py:fast), one seed.")
_SEEDS = flags.DEFINE_integer("seeds", 0, "Seeds per task (default: 3, or 1 with --fast).")
_TASKS = flags.DEFINE_string("tasks", "", f"Comma-separated subset of: {', '.join(suite.BY_NAME)} (default: all).")
_RANDOM = flags.DEFINE_bool("random_init", False, "Baseline: init_from's architecture and tokenizer, random weights.")
_LANGS = flags.DEFINE_string("pretrain_languages", "", "Languages the model was pretrained on, e.g. en,de "
                             "(default: the names of the workdir's data.sources, 'en=...').")
_DATA = flags.DEFINE_string("data_dir", "", "Folder holding downstream/ (default: $MLM_JAX_DATA or ../shared/data).")
_SET = flags.DEFINE_multi_string("set", [], "Override a field of every task's config, e.g. --set=train.steps=50.")


def _overrides(items: list) -> dict:
  out = {}
  for item in items:
    key, eq, value = item.partition("=")
    if not eq or not key:
      raise ConfigError(f"--set={item!r}: expected KEY=VALUE, e.g. train.steps=50")
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def _workdir() -> str:
  if _WORKDIR.value:
    return _WORKDIR.value
  out = os.path.join(_INIT_FROM.value, f"downstream_{'fast' if _FAST.value else 'full'}"
                     f"{'_random_init' if _RANDOM.value else ''}")
  if not os.access(_INIT_FROM.value, os.W_OK):
    raise ConfigError(f"--init_from={_INIT_FROM.value} is not writable: pass --workdir=OUT for the results")
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _INIT_FROM.value:
    raise ConfigError("--init_from is required: a pretraining workdir, a from_hf folder or a transformers folder")
  if not os.path.isdir(_INIT_FROM.value):
    raise ConfigError(f"--init_from={_INIT_FROM.value}: no such folder")
  runtime.start()
  suite.run_suite(_INIT_FROM.value, _workdir(), tasks=_TASKS.value, fast=_FAST.value, seeds=_SEEDS.value,
                  random_init=_RANDOM.value, pretrain_langs=_LANGS.value, data=_DATA.value,
                  overrides=_overrides(_SET.value))


def run():
  """Console-script entry point (`mlm-jax-downstream`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
