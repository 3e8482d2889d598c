"""The suite's zero-shot tasks (BLiMP, CLAMS, a user's pairs): the masked LM of INIT_FROM scores minimal pairs
by PLL, no training.

`--fast` scores FAST_PAIRS pairs of each set: the first of a BLiMP paradigm, pairs spread over a CLAMS file or a
phenomenon of a user's file (tasks/minimal_pairs.py `spread`); a finished result (OUT/TASK/result.json) is read back by a re-run of the same model, pairs and
PLL variant. The model is loaded once for every task that needs scoring, replicated over a mesh of every
device, its PLL rows split over it.
"""
from __future__ import annotations

import json
import os
import time

import jax

from mlm_jax.errors import NoMaskedLM, UserError
from mlm_jax.tasks import blimp, clams, minimal_pairs

FAST_PAIRS = 100          # per set: BLiMP 6,700 pairs (its first), CLAMS 5,000 (spread over each file)
PLL_ROWS = 64             # rows of packed masked copies per step
RESULT_FILE = "result.json"
GROUP_LABEL = dict(clams="language", pairs="file")   # what a set's group is, in the table
PROGRESS_SECONDS = 60     # at most one progress line this often while a task scores (all of BLiMP: ~20 min on 2 cores)


def load_masked_lm(init_from: str, source: str, random_init: bool, dtype: str = ""):
  """(MaskedLM, what it is): a transformers folder is read directly (so a folder without an MLM head is an
  error, not a fresh head's score), anything else as the workdir `source`; random_init: fresh weights;
  `dtype`: the compute dtype instead of the model's own."""
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.model.encoder import Encoder
  with open(os.path.join(init_from, "config.json"), encoding="utf-8") as f:
    is_hf = "model_type" in json.load(f)
  lm = fill_mask.from_hf_dir(init_from, dtype=dtype) if is_hf else fill_mask.from_workdir(source, dtype=dtype)
  if random_init:
    lm.model = Encoder(lm.model_config, seed=0)
    lm.source += " (random init)"
  return lm


def scorer_for(lm, variant: str = "token"):
  """(pll.Scorer, params placed on the mesh) for a MaskedLM."""
  from flax import nnx
  from mlm_jax.config.defaults import default_config
  from mlm_jax.evaluation import pll
  from mlm_jax.model import sharding
  pll.check_mlm_head(lm.model_config, lm.source)
  mesh = sharding.make_mesh(default_config().mesh)
  graphdef, params = nnx.split(lm.model, nnx.Param)
  params = jax.device_put(params, sharding.replicated(mesh))
  return pll.Scorer(graphdef, lm.tokenizer, pll.ROW_LEN, rows=PLL_ROWS, variant=variant, mesh=mesh,
                    max_len=pll.max_len(lm.model_config), shift=lm.shift), params


def read_sets(task, data: str, pairs: int, columns: dict | None = None, clams_languages=()) -> list:
  """The pair sets of a zero-shot task (catalogue.ZeroShotTask), the first `pairs` of each (0 = all); CLAMS's
  in `clams_languages` (() = all)."""
  if task.kind == "blimp":
    return blimp.read(blimp.folder(data), pairs)
  if task.kind == "clams":
    return clams.read(clams.folder(data), pairs, clams_languages)
  return minimal_pairs.read(task.pattern, columns, pairs)


def progress_lines(name: str, log, every: float):
  """`progress(done, total)` for pll.Scorer: a line with the sentences scored and the time left at most `every`
  seconds, none once all are done (the task's `finished` line follows)."""
  t0 = last = time.perf_counter()

  def report(done: int, total: int) -> None:
    nonlocal last
    now = time.perf_counter()
    if 0 < done < total and now - last >= every:
      last, spent = now, now - t0
      log(f"[downstream] {name}: {done:,} of {total:,} sentences scored ({100 * done / total:.0f}%) in "
          f"{spent:.0f} s, about {spent * (total - done) / done:.0f} s left")
  return report


def _kept(path: str, depends: dict, name: str, log) -> dict | None:
  """A kept result computed from the same model, pairs and PLL variant, else None (with a line saying why)."""
  from mlm_jax.finetuning.kept_result import differs
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  saved = result.get("depends_on")
  if saved is not None:
    saved = dict({"pll": "token"}, **saved)   # kept before --pll existed: token PLL
  if saved == depends:
    log(f"[downstream] {name}: done before, accuracy {100 * result['overall']:.1f} (skipped)")
    return result
  what = differs(saved, depends) if saved else "no record of the model it scored"
  log(f"[downstream] {name}: the kept result is of another model or subset ({what}); scoring again")
  return None


def run_tasks(tasks: list, *, init_from: str, source: str, out: str, fast: bool, random_init: bool, data: str,
              log, identity: dict, pairs: int = 0, blimp_pairs: int = 0, columns: dict | None = None,
              variant: str = "token", skip_without_head: bool = False, clams_languages=(), dtype: str = "") -> dict:
  """{task name: summary (evaluation/zeroshot.py) plus seconds, published rows, source}, each computed once and
  kept in OUT/TASK; `pairs` a set (0: FAST_PAIRS with `fast`, else all; BLiMP: `blimp_pairs` if given). A kept
  result is read back only when computed from the same model (`identity`: kept_result.zeroshot_identity, the
  PLL variant and a chosen `dtype` included) on the same pairs; `dtype`: the compute dtype that scores (default:
  the model's). `skip_without_head`: a model without an MLM head skips the tasks
  with one line (the default task list) instead of failing."""
  from mlm_jax.evaluation import zeroshot
  from mlm_jax.finetuning.kept_result import digest
  scorer = params = lm = None
  results = {}
  for task in tasks:
    n = (blimp_pairs if task.kind == "blimp" and blimp_pairs else pairs) or (FAST_PAIRS if fast else 0)
    try:
      sets = read_sets(task, data, n, columns, clams_languages)
    except UserError as e:
      raise type(e)(f"{task.name}: {e}") from None
    total = sum(len(s.good) for s in sets)
    depends = dict(identity, pairs=total)
    if task.kind == "pairs":   # a user's files may change: the pairs themselves, by content
      depends["pair_sets"] = digest([(s.name, s.good, s.bad) for s in sets])
    done = os.path.join(out, task.folder, RESULT_FILE)
    kept = _kept(done, depends, task.name, log)
    if kept is not None:
      results[task.name] = kept
      continue
    if scorer is None:
      try:
        lm = load_masked_lm(init_from, source, random_init, dtype)
        scorer, params = scorer_for(lm, variant)
      except NoMaskedLM as e:
        if skip_without_head:
          log(f"[downstream] {', '.join(t.name for t in tasks)}: skipped, {e}")
          return {}
        raise type(e)(f"{task.name}: {e}") from None
      except UserError as e:
        raise type(e)(f"{task.name}: {e}") from None
    log(f"[downstream] {task.name}: started ({total} pairs, {len(sets)} sets, {variant} PLL in "
        f"{lm.model_config.dtype})")
    result = zeroshot.score_pairs(scorer, params, sets, progress_lines(task.name, log, PROGRESS_SECONDS))
    result.update(source=lm.source, depends_on=depends, group=GROUP_LABEL.get(task.kind, ""),
                  dtype=lm.model_config.dtype)
    if task.kind == "blimp":
      result["published"] = blimp.published(blimp.folder(data))
    os.makedirs(os.path.dirname(done), exist_ok=True)
    with open(done + ".tmp", "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1, sort_keys=True)
    os.replace(done + ".tmp", done)
    if result["too_long"]:
      log(f"[downstream] {task.name}: {result['too_long']} pairs have a sentence longer than the model's "
          f"{result['longest']} tokens: counted wrong")
    log(f"[downstream] {task.name}: finished, accuracy {100 * result['overall']:.1f} ({result['seconds']:.0f} s)")
    results[task.name] = result
  return results
