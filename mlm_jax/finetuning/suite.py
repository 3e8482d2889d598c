"""The downstream suite's runner: every selected task of the catalogue (tasks/catalogue.py), its budget
and N seeds, through the one fine-tuning path (finetuner.py), in OUT/TASK/seedN; zero-shot tasks
(zeroshot_suite.py) in OUT/TASK.

A finished run's suite_result.json is read back by a re-run, a killed one resumes, as long as what the
result depends on (`depends_on`: the init checkpoint, the task's config, --set, mode) is unchanged; otherwise
the seed's folder is moved aside (seedN.stale) and it trains again. Then one table (suite_report.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time

from mlm_jax import errors
from mlm_jax.errors import DataError, Preempted
from mlm_jax.finetuning import kept_result
from mlm_jax.tasks.catalogue import SuiteTask, data_dir, extra_evals, load_config, select, select_zeroshot

RESULT_FILE = "suite_result.json"
QA_SPECIAL_TOKENS = 4   # <s> question </s></s> context </s>: the most a layout adds (BERT's adds 3)
DEPENDS_FILE = "suite_depends.json"   # written when a seed starts: a killed run resumes only on the same inputs


def say(message: str) -> None:
  """Progress on stdout, flushed: a line per task and seed started and finished, also when piped to a file."""
  print(message, flush=True)


def fit_to_model(config, source: str) -> str:
  """Sequences no longer than the model's learned positions (the demo model has 64): the budgets are
  the configs', the model decides how much text it can read. A QA window keeps its overlap: doc_stride
  is at most half the context a window holds. Returns a note for the log, or ''."""
  from mlm_jax.workdir import files as workdir_files
  m = workdir_files.read_config(source).get("model", {})
  if m.get("positions", "learned") != "learned":
    return ""
  limit = int(m.get("max_position_embeddings", 512)) - int(m.get("position_offset", 0))
  if config.seq_len <= limit:
    return ""
  notes = [f"seq_len {config.seq_len} -> {limit} (the model's positions)"]
  config.seq_len = limit
  config.task.max_query_length = min(config.task.max_query_length, limit // 4)
  if config.task.kind == "qa":
    context = limit - config.task.max_query_length - QA_SPECIAL_TOKENS   # a window's context pieces, at least
    stride = max(1, context // 2)
    if config.task.doc_stride > stride:
      notes.append(f"doc_stride {config.task.doc_stride} -> {stride} (half a window, so windows overlap)")
      config.task.doc_stride = stride
  return ", ".join(notes)


def _result(task: SuiteTask, seed: int, r: dict, seconds: float) -> dict:
  """One task/seed's record: the reported scores (test split) and the zero-shot scores per language."""
  extra = r.get("extra", {})
  test = extra["test"] if task.dev else r
  pick = lambda scores: {k[5:]: v for k, v in scores.items() if k.startswith("eval_")}
  return dict(task=task.name, seed=seed, metric=task.metric, score=test[f"eval_{task.metric}"], scores=pick(test),
              dev=pick(r) if task.dev else None, best_step=r.get("best_step"), seconds=round(seconds, 1),
              crosslingual={k[3:]: v[f"eval_{task.metric}"] for k, v in extra.items() if k.startswith("xl:")})


def pretrain_languages(init_from: str, flag: str) -> tuple[list, str]:
  """(languages, where from): the flag, else the source names of the workdir's data.sources ('en=...')."""
  if flag:
    return sorted({x.strip() for x in flag.split(",") if x.strip()}), "--pretrain_languages"
  from mlm_jax.workdir import files as workdir_files
  try:
    sources = workdir_files.read_config(init_from).get("data", {}).get("sources", [])
  except (OSError, ValueError, errors.CheckpointError):
    sources = []
  names = {s.split("=", 1)[0] for s in sources if "=" in s}
  langs = sorted(n for n in names if re.fullmatch(r"[a-z]{2,3}", n))
  if langs:
    return langs, "data.sources of init_from's config.json"
  return [], "unknown (pass --pretrain_languages=en,de,...)"


def depends_on(task: SuiteTask, config, *, init_from: str, mode: str, random_init: bool,
               overrides: dict | None) -> dict:
  """What a seed's result depends on: the init checkpoint (`kept_result.init_identity`), the task and its
  final config (seed, --set overrides and the seq_len fitted to the model included), the mode."""
  return dict(kept_result.init_identity(init_from, random_init), mode=mode,
              overrides={k: str(v) for k, v in (overrides or {}).items()},
              task=kept_result.digest(dataclasses.asdict(task)), config=kept_result.digest(config.to_dict()))


def _read_json(path: str) -> dict | None:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _move_aside(workdir: str) -> str:
  """A seed folder of another model or config moves to seedN.stale (replacing an older one), out of the way."""
  stale = workdir + ".stale"
  if os.path.exists(stale):
    shutil.rmtree(stale)
  os.replace(workdir, stale)
  return stale


def run_one(task: SuiteTask, seed: int, *, init_from: str, out: str, mode: str, data: str, random_init: bool,
            overrides: dict | None = None, log=say) -> dict:
  """Fine-tunes one task with one seed (or reads back the result of a finished run of the same inputs)."""
  from mlm_jax.finetuning import finetuner
  workdir = os.path.join(out, task.name, f"seed{seed}")
  config = load_config(task, mode, data)
  config.seed, config.random_init = seed, random_init
  if not task.dev:
    config.train.eval_every = 0   # the eval set is the test split: score it once, at the last step
  for key, value in (overrides or {}).items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  note = fit_to_model(config, init_from)
  depends = depends_on(task, config, init_from=init_from, mode=mode, random_init=random_init, overrides=overrides)
  done = os.path.join(workdir, RESULT_FILE)
  result = _read_json(done)
  if result is not None and result.get("depends_on") == depends:
    log(f"[downstream] {task.name} seed {seed}: done before, {task.metric} {100 * result['score']:.1f} (skipped)")
    return result
  started = _read_json(os.path.join(workdir, DEPENDS_FILE))
  before = result.get("depends_on", {}) if result is not None else started
  if os.path.isdir(workdir) and (result is not None or before is None or before != depends):
    what = kept_result.differs(before or {}, depends) if before else "no record of what it was trained on"
    log(f"[downstream] {task.name} seed {seed}: {'result' if result is not None else 'run'} of another "
        f"model or config ({what}); training again (the old folder is {_move_aside(workdir)})")
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, DEPENDS_FILE), "w", encoding="utf-8") as f:
    json.dump(depends, f, indent=1, sort_keys=True)
  log(f"[downstream] {task.name} seed {seed}: started ({config.train.steps} steps x {config.train.batch_size}"
      f"{', ' + note if note else ''})")
  t0 = time.time()
  try:
    r = finetuner.finetune(config, workdir, init_from=init_from, extra_evals=extra_evals(task, data))
  except Preempted:
    log(f"[downstream] {task.name} seed {seed}: preempted")
    raise
  result = dict(_result(task, seed, r, time.time() - t0), depends_on=depends)
  with open(done + ".tmp", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  os.replace(done + ".tmp", done)   # written whole, or not at all
  log(f"[downstream] {task.name} seed {seed}: finished, {task.metric} {100 * result['score']:.1f} "
      f"({result['seconds']:.0f} s)")
  return result


def run_suite(init_from: str, out: str, *, tasks="", fast: bool = False, seeds: int = 0,
              random_init: bool = False, pretrain_langs: str = "", data: str = "", overrides: dict | None = None,
              log=say, blimp_pairs: int = 0, zeroshot_pairs: int = 0, pll: str = "token",
              pair_columns: dict | None = None, clams_languages: tuple = (), zeroshot_dtype: str = "") -> dict:
  """Every selected task x seed (finished ones read back) and the zero-shot tasks, then the summary, written
  to OUT/downstream.json and OUT/downstream.txt. A transformers folder is converted once, into OUT/init_model.
  `tasks`: 'a,b' or a list of such strings (--tasks repeated); zero-shot tasks score `zeroshot_pairs` pairs a set
  (BLiMP: `blimp_pairs` if given) by the `pll` variant, a pairs task's columns named by `pair_columns`; CLAMS
  in `clams_languages` (() = all five), computed in `zeroshot_dtype` (default: the model's compute dtype)."""
  from mlm_jax.evaluation import pll as pll_lib
  from mlm_jax.finetuning import suite_report, zeroshot_suite
  from mlm_jax.training import provision
  chosen, zero = select(tasks), select_zeroshot(tasks)
  pll_lib.check_variant(pll, "--pll")
  need = "downstream" if chosen else next((z.data for z in zero if z.data), "")
  data = data_dir(data, need) if need else data
  for t in chosen:
    if not os.path.isdir(os.path.join(data, "downstream", t.folder)):
      raise DataError(f"{os.path.join(data, 'downstream', t.folder)}: no such folder (the data of task {t.name!r})")
  mode, num_seeds = ("fast" if fast else "full"), seeds or (1 if fast else 3)
  os.makedirs(out, exist_ok=True)
  source = provision.import_transformers(init_from, out) if chosen else init_from
  langs, langs_from = pretrain_languages(init_from, pretrain_langs)
  zeroshot = zeroshot_suite.run_tasks(
      zero, init_from=init_from, source=source, out=out, fast=fast, random_init=random_init, data=data, log=log,
      identity=kept_result.zeroshot_identity(init_from, random_init, pll, zeroshot_dtype), pairs=zeroshot_pairs,
      blimp_pairs=blimp_pairs, columns=pair_columns, variant=pll, skip_without_head=not tasks,
      clams_languages=clams_languages, dtype=zeroshot_dtype) if zero else {}
  results = {}
  for t in chosen:
    results[t.name] = [run_one(t, s, init_from=source, out=out, mode=mode, data=data, random_init=random_init,
                               overrides=overrides, log=log) for s in range(num_seeds)]
  info = dict(init_from=os.path.abspath(init_from), mode=mode, num_seeds=num_seeds, random_init=random_init,
              pretrain_languages=langs, pretrain_languages_from=langs_from, data=data)
  summary = suite_report.summarize(chosen, results, info, zeroshot)
  table = suite_report.format_table(summary)
  with open(os.path.join(out, "downstream.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)   # tasks in the suite's order
  with open(os.path.join(out, "downstream.txt"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  log(table)
  return summary


def run_with_baseline(init_from: str, out: str, log=say, **common) -> tuple[dict, dict]:
  """The suite for the model (OUT) and for its random init (OUT/random_init), then both side by side
  (OUT/baseline.txt): whether pretraining helped, task by task, at these budgets."""
  from mlm_jax.finetuning import suite_report
  model = run_suite(init_from, out, random_init=False, log=log, **common)
  baseline = run_suite(init_from, os.path.join(out, "random_init"), random_init=True, log=log, **common)
  table = suite_report.comparison_table(model, baseline)
  with open(os.path.join(out, "baseline.txt"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  log(table)
  return model, baseline
