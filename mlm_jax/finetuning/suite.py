"""The downstream suite: every task in ../shared/data/downstream, fine-tuned with fixed budgets, N seeds.

One entry of TASKS per task says which fine-tuning config holds its budget (configs/finetune/NAME.py,
`:fast` for the fast budget), which metric the table reports, how its model is selected and what
it is scored on:

* `dev=True`: the config's eval set is a dev split; the best checkpoint on it is scored on `test`.
* `dev=False`: there is no dev split; the config's eval set is the reported test split (an official
  test file, or a held-out part of the training file by group), evaluated at the last step only, so
  the test split never chooses a checkpoint.
* `crosslingual`: XTREME's zero-shot setting: the model fine-tuned on English is scored on the same
  task in every other language the data has (one column per language). For parallel data without
  a split (PUD by sent_id, XQuAD by article title) only the held-out groups are scored, so no
  translation of a training example is ever a test example (mlm_jax.tasks.task.build_eval).

Every task and seed runs the one fine-tuning path (mlm_jax.finetune.finetune, the one loop) in
OUT/TASK/seedN and writes OUT/TASK/seedN/suite_result.json when it is done; a re-run reads those
back instead of training again, and a task killed mid-run resumes from its own checkpoint.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import re
import time

from mlm_jax.errors import ConfigError, DataError

RESULT_FILE = "suite_result.json"


def say(message: str) -> None:
  """Progress on stdout, flushed: a line per task and seed started and finished, also when piped to a file."""
  print(message, flush=True)


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
TRAIN_LANGUAGE = "en"


def data_dir(path: str = "") -> str:
  """The folder holding downstream/ (--data_dir, else $MLM_JAX_DATA, else ../shared/data)."""
  root = path or os.environ.get("MLM_JAX_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                 "shared", "data")
  if not os.path.isdir(os.path.join(root, "downstream")):
    raise DataError(f"{os.path.join(root, 'downstream')}: no such folder (the downstream data sets; set "
                    "MLM_JAX_DATA or --data_dir to the folder holding downstream/)")
  return os.path.abspath(root)


def select(names: str) -> list[SuiteTask]:
  """--tasks=a,b (empty: all), in the suite's order; an unknown name is an error naming the choices."""
  wanted = [n.strip() for n in names.split(",") if n.strip()] if names else [t.name for t in TASKS]
  unknown = [n for n in wanted if n not in BY_NAME]
  if unknown:
    raise ConfigError(f"--tasks: unknown task {unknown[0]!r} (expected some of {', '.join(BY_NAME)})")
  return [t for t in TASKS if t.name in wanted]


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


def fit_to_model(config, source: str) -> str:
  """Sequences no longer than the model's learned positions (the demo model has 64): the budgets are
  the configs', the model decides how much text it can read. Returns a note for the log, or ''."""
  with open(os.path.join(source, "config.json"), encoding="utf-8") as f:
    m = json.load(f).get("model", {})
  if m.get("positions", "learned") != "learned":
    return ""
  limit = int(m.get("max_position_embeddings", 512)) - int(m.get("position_offset", 0))
  if config.seq_len <= limit:
    return ""
  note = f"seq_len {config.seq_len} -> {limit} (the model's positions)"
  config.seq_len = limit
  config.task.max_query_length = min(config.task.max_query_length, limit // 4)
  return note


def _result(task: SuiteTask, seed: int, r: dict, seconds: float) -> dict:
  """One task/seed's record: the reported scores (test split) and the zero-shot scores per language."""
  extra = r.get("extra", {})
  test = extra["test"] if task.dev else r
  pick = lambda scores: {k[5:]: v for k, v in scores.items() if k.startswith("eval_")}
  return dict(task=task.name, seed=seed, metric=task.metric, score=test[f"eval_{task.metric}"], scores=pick(test),
              dev=pick(r) if task.dev else None, best_step=r.get("best_step"), seconds=round(seconds, 1),
              crosslingual={k[3:]: v[f"eval_{task.metric}"] for k, v in extra.items() if k.startswith("xl:")})


def run_one(task: SuiteTask, seed: int, *, init_from: str, out: str, mode: str, data: str, random_init: bool,
            overrides: dict | None = None, log=say) -> dict:
  """Fine-tunes one task with one seed (or reads back the result of a finished run)."""
  from mlm_jax import finetune
  workdir = os.path.join(out, task.name, f"seed{seed}")
  done = os.path.join(workdir, RESULT_FILE)
  if os.path.exists(done):
    with open(done, encoding="utf-8") as f:
      result = json.load(f)
    log(f"[downstream] {task.name} seed {seed}: done before, {task.metric} {100 * result['score']:.1f} (skipped)")
    return result
  config = load_config(task, mode, data)
  config.seed, config.random_init = seed, random_init
  if not task.dev:
    config.train.eval_every = 0   # the eval set is the test split: score it once, at the last step
  for key, value in (overrides or {}).items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  note = fit_to_model(config, init_from)
  log(f"[downstream] {task.name} seed {seed}: started ({config.train.steps} steps x {config.train.batch_size}"
      f"{', ' + note if note else ''})")
  t0 = time.time()
  r = finetune.finetune(config, workdir, init_from=init_from, extra_evals=extra_evals(task, data))
  if not r:
    raise SystemExit(f"[downstream] {task.name} seed {seed}: preempted; re-run the same command to resume")
  result = _result(task, seed, r, time.time() - t0)
  with open(done + ".tmp", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  os.replace(done + ".tmp", done)   # written whole, or not at all
  log(f"[downstream] {task.name} seed {seed}: finished, {task.metric} {100 * result['score']:.1f} "
      f"({result['seconds']:.0f} s)")
  return result


def pretrain_languages(init_from: str, flag: str) -> tuple[list, str]:
  """(languages, where from): the flag, else the source names of the workdir's data.sources ('en=...')."""
  if flag:
    return sorted({x.strip() for x in flag.split(",") if x.strip()}), "--pretrain_languages"
  try:
    with open(os.path.join(init_from, "config.json"), encoding="utf-8") as f:
      sources = json.load(f).get("data", {}).get("sources", [])
  except (OSError, ValueError):
    sources = []
  names = {s.split("=", 1)[0] for s in sources if "=" in s}
  langs = sorted(n for n in names if re.fullmatch(r"[a-z]{2,3}", n))
  if langs:
    return langs, "data.sources of init_from's config.json"
  return [], "unknown (pass --pretrain_languages=en,de,...)"


def run_suite(init_from: str, out: str, *, tasks: str = "", fast: bool = False, seeds: int = 0,
              random_init: bool = False, pretrain_langs: str = "", data: str = "", overrides: dict | None = None,
              log=say) -> dict:
  """Every selected task x seed (finished ones read back), then the summary, written to OUT/downstream.json
  and OUT/downstream.txt. A transformers folder is converted once, into OUT/init_model."""
  from mlm_jax.training import resolve
  from mlm_jax.finetuning import suite_report
  data, chosen = data_dir(data), select(tasks)
  for t in chosen:
    if not os.path.isdir(os.path.join(data, "downstream", t.folder)):
      raise DataError(f"{os.path.join(data, 'downstream', t.folder)}: no such folder (the data of task {t.name!r})")
  mode, num_seeds = ("fast" if fast else "full"), seeds or (1 if fast else 3)
  os.makedirs(out, exist_ok=True)
  source = resolve.init_source(init_from, out)
  langs, langs_from = pretrain_languages(init_from, pretrain_langs)
  results = {}
  for t in chosen:
    results[t.name] = [run_one(t, s, init_from=source, out=out, mode=mode, data=data, random_init=random_init,
                               overrides=overrides, log=log) for s in range(num_seeds)]
  info = dict(init_from=os.path.abspath(init_from), mode=mode, num_seeds=num_seeds, random_init=random_init,
              pretrain_languages=langs, pretrain_languages_from=langs_from, data=data)
  summary = suite_report.summarize(chosen, results, info)
  table = suite_report.format_table(summary)
  with open(os.path.join(out, "downstream.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)   # tasks in the suite's order
  with open(os.path.join(out, "downstream.txt"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  log(table)
  return summary
