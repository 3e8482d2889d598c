"""The downstream suite's catalogue: every task in ../shared/data/downstream, its budget, metric and scoring.

Budgets are configs/finetune/NAME.py (`:fast` for the fast one); `dev` and XTREME's zero-shot `crosslingual`
decide which split chooses a checkpoint and which is reported (docs/design_notes.md#catalogue).
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re

from mlm_jax.errors import ConfigError, DataError
from mlm_jax.tasks import blimp, clams


@dataclasses.dataclass(frozen=True)
class SuiteTask:
  name: str                 # the table's row and the folder under OUT
  config: str               # configs/finetune/<config>.py
  metric: str               # the reported eval metric (eval_<metric>)
  folder: str               # its data folder under DATA/downstream
  dev: bool = False         # the config's eval set is a dev split (see the module doc)
  test: tuple = ()          # dev=True: the reported test files, relative to the folder
  crosslingual: str = ""    # glob (relative to the folder) of the files of all languages
  lang: str = ""            # regex whose group 1 is the language of a file's name
  also: str = ""            # a second metric shown beside the first (QA: exact match)


TASKS = (
    SuiteTask("polarity", "sentiment", "accuracy", "sentiment_sentence_polarity"),
    SuiteTask("movie_reviews", "movie_reviews", "accuracy", "sentiment_movie_reviews"),
    SuiteTask("trec", "trec", "accuracy", "question_classification_trec"),
    SuiteTask("sms_spam", "sms_spam", "macro_f1", "sms_spam"),   # 87% ham: macro-F1, not accuracy
    SuiteTask("wnut17", "wnut17", "f1", "ner_wnut17", dev=True, test=("emerging.test.annotated.gz",)),
    SuiteTask("uner", "ner", "f1", "ner_uner", crosslingual="*-test.iob2.gz", lang=r"([a-z]{2,3})_"),
    SuiteTask("pos", "pos", "token_accuracy", "pos_ud_pud", crosslingual="*_pud-ud-test.conllu.gz",
              lang=r"([a-z]{2,3})_"),
    SuiteTask("xquad", "qa", "f1", "qa_xquad", crosslingual="xquad.*.json.gz", lang=r"xquad\.([a-z]{2,3})\.",
              also="exact_match"),
)
BY_NAME = {t.name: t for t in TASKS}
# Scored by the masked LM itself, without fine-tuning (finetuning/zeroshot_suite.py), and their data folders.
ZERO_SHOT = dict(blimp=blimp.FOLDER, clams=clams.FOLDER)
ALL_NAMES = tuple(BY_NAME) + tuple(ZERO_SHOT)
DEFAULT_NAMES = tuple(BY_NAME) + ("blimp",)   # without --tasks: CLAMS (335,466 pairs) is scored when named
PAIRS = "pairs:"   # --tasks=pairs:NAME=GLOB, a user's own minimal pairs (tasks/minimal_pairs.py)
TRAIN_LANGUAGE = "en"


@dataclasses.dataclass(frozen=True)
class ZeroShotTask:
  name: str                 # the table's row: blimp, clams, or a pairs task's NAME
  kind: str                 # blimp | clams | pairs
  pattern: str = ""         # pairs: the glob of its files

  @property
  def folder(self) -> str:
    """Its results' folder under OUT."""
    return f"pairs_{self.name}" if self.kind == "pairs" else self.name

  @property
  def data(self) -> str:
    """Its data folder under DATA ('' for a user's files)."""
    return ZERO_SHOT.get(self.kind, "")


def data_dir(path: str = "", need: str = "downstream") -> str:
  """The folder holding `need` (downstream/; zeroshot/blimp; zeroshot/clams) (--data_dir, else $MLM_JAX_DATA, else
  ../shared/data)."""
  root = path or os.environ.get("MLM_JAX_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                 "shared", "data")
  if not os.path.isdir(os.path.join(root, need)):
    raise DataError(f"{os.path.join(root, need)}: no such folder (the suite's data sets; set "
                    f"MLM_JAX_DATA or --data_dir to the folder holding {need}/)")
  return os.path.abspath(root)


def _wanted(names) -> list:
  """The items of --tasks: one string 'a,b' or several (the flag repeated); none: DEFAULT_NAMES."""
  values = [names] if isinstance(names, str) else list(names or ())
  wanted = [n.strip() for v in values for n in v.split(",") if n.strip()] or list(DEFAULT_NAMES)
  unknown = [n for n in wanted if n not in ALL_NAMES and not n.startswith(PAIRS)]
  if unknown:
    raise ConfigError(f"--tasks: unknown task {unknown[0]!r} (expected some of {', '.join(ALL_NAMES)}, "
                      f"or {PAIRS}NAME=GLOB)")
  return wanted


def select(names) -> list[SuiteTask]:
  """The fine-tuning tasks of --tasks=a,b (empty: all), in the suite's order; an unknown name is an error
  naming the choices."""
  wanted = _wanted(names)
  return [t for t in TASKS if t.name in wanted]


def _pairs_task(item: str) -> ZeroShotTask:
  name, eq, pattern = item[len(PAIRS):].partition("=")
  if not eq or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or not pattern.strip():
    raise ConfigError(f"--tasks={item}: expected {PAIRS}NAME=GLOB, NAME of letters, digits, _ . -, e.g. "
                      f"{PAIRS}multiblimp='data/*/data.tsv'")
  if name in BY_NAME or name in ZERO_SHOT:
    raise ConfigError(f"--tasks={item}: {name!r} is the suite's own task; name the pairs otherwise")
  return ZeroShotTask(name, "pairs", pattern.strip())


def select_zeroshot(names) -> list[ZeroShotTask]:
  """The zero-shot tasks of --tasks (empty: DEFAULT_NAMES's): BLiMP, CLAMS, then pairs tasks as given."""
  wanted = _wanted(names)
  out = [ZeroShotTask(n, n) for n in ZERO_SHOT if n in wanted]
  out += [_pairs_task(n) for n in wanted if n.startswith(PAIRS)]
  seen = [t.name for t in out]
  twice = next((n for n in seen if seen.count(n) > 1), None)
  if twice:
    raise ConfigError(f"--tasks: two pairs tasks are named {twice!r}")
  return out


def configs_dir() -> str:
  return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", "finetune")


def load_config(task: SuiteTask, mode: str, data: str):
  """configs/finetune/<task.config>.py:<mode>, reading its files from `data` (the configs read $MLM_JAX_DATA)."""
  path = os.path.join(configs_dir(), f"{task.config}.py")
  if not os.path.exists(path):
    raise ConfigError(f"{path}: no such config (the suite's budget for task {task.name!r})")
  os.environ["MLM_JAX_DATA"] = data
  spec = importlib.util.spec_from_file_location(f"_suite_config_{task.config}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(mode)


def languages(task: SuiteTask, data: str) -> dict:
  """{language: [files]} of the task's other-language test files (English is the training language)."""
  if not task.crosslingual:
    return {}
  out = {}
  for path in sorted(glob.glob(os.path.join(data, "downstream", task.folder, task.crosslingual))):
    m = re.match(task.lang, os.path.basename(path))
    if m and m.group(1) != TRAIN_LANGUAGE:
      out.setdefault(m.group(1), []).append(path)
  return out


def extra_evals(task: SuiteTask, data: str) -> dict:
  """The eval sets scored with the selected checkpoint besides the config's own: 'test' and 'xl:LANG'."""
  folder = os.path.join(data, "downstream", task.folder)
  out = {"test": tuple(os.path.join(folder, f) for f in task.test)} if task.dev else {}
  out.update({f"xl:{lang}": tuple(files) for lang, files in languages(task, data).items()})
  return out
