"""Downstream suite binary: python -m mlm_jax.downstream --init_from=DIR [--fast] [--seeds=N] [--tasks=a,b]

Fine-tunes DIR (a pretraining workdir, a `convert_checkpoint.py from_hf` folder or a transformers folder)
on every task in ../shared/data/downstream with the budgets of configs/finetune/*.py (`--fast`: `:fast`,
one seed), N seeds each, and scores its masked LM zero-shot on BLiMP (`--fast`: 100 pairs a paradigm);
`--tasks=clams` scores CLAMS's five languages, `--tasks=pairs:NAME=GLOB` a user's own minimal pairs, by the
`--pll` variant. Prints one table and writes OUT/downstream.json; a re-run skips what is done. `--baseline`
runs the same for random weights too and prints the model beside them (OUT/baseline.txt).
"""
from __future__ import annotations

import ast
import os

from absl import app, flags

from mlm_jax import runtime
from mlm_jax.errors import ConfigError
from mlm_jax.finetuning import suite
from mlm_jax.tasks import catalogue

_INIT_FROM = flags.DEFINE_string("init_from", None, "Pretraining workdir, from_hf folder or transformers folder.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (default: INIT_FROM/downstream_MODE).")
_FAST = flags.DEFINE_bool("fast", False, "The configs' fast budgets (configs/finetune/TASK.py:fast), one seed; "
                          "BLiMP: the first 100 pairs of each paradigm.")
_SEEDS = flags.DEFINE_integer("seeds", 0, "Seeds per task (default: 3, or 1 with --fast).")
_TASKS = flags.DEFINE_multi_string("tasks", [], f"Comma-separated subset of: {', '.join(catalogue.ALL_NAMES)}, and "
                                   "pairs:NAME=GLOB (a user's minimal pairs: .tsv/.csv with a header row or .jsonl, "
                                   "a GLOB without commas); repeatable (default: all but clams).")
_RANDOM = flags.DEFINE_bool("random_init", False, "Baseline: init_from's architecture and tokenizer, random weights.")
_BASELINE = flags.DEFINE_bool("baseline", False, "Also run the random-init baseline (into OUT/random_init) and "
                              "print the model beside it, with the gain per task and BLiMP phenomenon.")
_LANGS = flags.DEFINE_string("pretrain_languages", "", "Languages the model was pretrained on, e.g. en,de "
                             "(default: the names of the workdir's data.sources, 'en=...').")
_DATA = flags.DEFINE_string("data_dir", "", "Folder holding downstream/ and zeroshot/ (default: $MLM_JAX_DATA or "
                            "../shared/data).")
_BLIMP_PAIRS = flags.DEFINE_integer("blimp_pairs", 0, "BLiMP pairs per paradigm (default: --zeroshot_pairs, else 100 "
                                    "with --fast, else all 1,000).")
_ZS_PAIRS = flags.DEFINE_integer("zeroshot_pairs", 0, "Pairs per set of every zero-shot task (a BLiMP paradigm, a "
                                 "CLAMS file, a phenomenon of a pairs file; default: 100 with --fast, else all).")
_CLAMS_LANGS = flags.DEFINE_list("clams_languages", [], "clams: score only these of its languages, e.g. en,de,fr,ru "
                                  "(default: all five).")
_PLL = flags.DEFINE_enum("pll", "token", ["token", "whole_word", "word_l2r"], "Pseudo-log-likelihood of the "
                         "zero-shot tasks: each piece masked alone (token), each word whole (whole_word), or each "
                         "piece with the rest of its word to its right (word_l2r, Kauf & Ivanova 2023).")
_DTYPE = flags.DEFINE_enum("zeroshot_dtype", "", ["", "float32", "bfloat16"], "The compute dtype that scores the "
                            "zero-shot tasks (default: the model's own; the parameters stay as saved).")
_GOOD = flags.DEFINE_string("pairs_good", "good", "pairs tasks: the column of the grammatical sentence.")
_BAD = flags.DEFINE_string("pairs_bad", "bad", "pairs tasks: the column of the ungrammatical sentence.")
_PHENOMENON = flags.DEFINE_string("pairs_phenomenon", "phenomenon", "pairs tasks: the column of the phenomenon "
                                  "(optional in a file unless named).")
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


def _workdir(init_from: str) -> str:
  """--workdir, else INIT_FROM/downstream_MODE[_random_init]."""
  if _WORKDIR.value:
    return _WORKDIR.value
  if not os.access(init_from, os.W_OK):
    raise ConfigError(f"--init_from={init_from} is not writable: pass --workdir=OUT for the results")
  mode = "fast" if _FAST.value else "full"
  return os.path.join(init_from, f"downstream_{mode}{'_random_init' if _RANDOM.value else ''}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  init_from = _INIT_FROM.value
  if not init_from:
    raise ConfigError("--init_from is required: a pretraining workdir, a from_hf folder or a transformers folder")
  if not os.path.isdir(init_from):
    raise ConfigError(f"--init_from={init_from}: no such folder")
  if _BASELINE.value and _RANDOM.value:
    raise ConfigError("--baseline runs the random init beside the model: leave out --random_init")
  runtime.start()
  out = _workdir(init_from)
  common = dict(tasks=_TASKS.value, fast=_FAST.value, seeds=_SEEDS.value, pretrain_langs=_LANGS.value,
                data=_DATA.value, overrides=_overrides(_SET.value), blimp_pairs=_BLIMP_PAIRS.value,
                zeroshot_pairs=_ZS_PAIRS.value, pll=_PLL.value, clams_languages=tuple(_CLAMS_LANGS.value),
                zeroshot_dtype=_DTYPE.value,
                pair_columns=dict(good=_GOOD.value, bad=_BAD.value, phenomenon=_PHENOMENON.value))
  if _BASELINE.value:
    suite.run_with_baseline(init_from, out, **common)
  else:
    suite.run_suite(init_from, out, random_init=_RANDOM.value, **common)


def run():
  """Console-script entry point (`mlm-jax-downstream`)."""
  runtime.run(main)


if __name__ == "__main__":
  run()
