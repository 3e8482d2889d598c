"""The suite's zero-shot tasks (BLiMP): the masked LM of INIT_FROM scores minimal pairs by PLL, no training.

`--fast` scores the first FAST_PAIRS pairs of each paradigm; a finished result (OUT/blimp/result.json) is
read back by a re-run. The model is replicated over a mesh of every device, its PLL rows split over it.
"""
from __future__ import annotations

import json
import os

import jax

from mlm_jax.errors import UserError
from mlm_jax.tasks import blimp

FAST_PAIRS = 100          # per paradigm: 6,700 pairs
PLL_ROWS = 64             # rows of packed masked copies per step
RESULT_FILE = "result.json"


def load_masked_lm(init_from: str, source: str, random_init: bool):
  """(MaskedLM, what it is): a transformers folder is read directly (so a folder without an MLM head is an
  error, not a fresh head's score), anything else as the workdir `source`; random_init: fresh weights."""
  from mlm_jax.evaluation import fill_mask
  from mlm_jax.model.encoder import Encoder
  with open(os.path.join(init_from, "config.json"), encoding="utf-8") as f:
    is_hf = "model_type" in json.load(f)
  lm = fill_mask.from_hf_dir(init_from) if is_hf else fill_mask.from_workdir(source)
  if random_init:
    lm.model = Encoder(lm.model_config, seed=0)
    lm.source += " (random init)"
  return lm


def scorer_for(lm, whole_word: bool = False):
  """(pll.Scorer, params placed on the mesh) for a MaskedLM."""
  from flax import nnx
  from mlm_jax.config.defaults import default_config
  from mlm_jax.evaluation import pll
  from mlm_jax.model import sharding
  pll.check_mlm_head(lm.model_config, lm.source)
  mesh = sharding.make_mesh(default_config().mesh)
  graphdef, params = nnx.split(lm.model, nnx.Param)
  params = jax.device_put(params, sharding.replicated(mesh))
  return pll.Scorer(graphdef, lm.tokenizer, pll.ROW_LEN, rows=PLL_ROWS, whole_word=whole_word, mesh=mesh,
                    max_len=pll.max_len(lm.model_config), shift=lm.shift), params


def run_blimp(*, init_from: str, source: str, out: str, fast: bool, random_init: bool, data: str, log,
              pairs: int = 0, identity: dict | None = None) -> dict:
  """BLiMP's summary (evaluation/zeroshot.py) plus `seconds`, computed once and kept in OUT/blimp; the first
  `pairs` pairs a paradigm (0: FAST_PAIRS with `fast`, else all). A kept result is read back only when it
  was computed from the same model (`identity`: folder, newest step, config) on the same pairs."""
  from mlm_jax.evaluation import zeroshot
  from mlm_jax.finetuning.kept_result import differs
  where = blimp.folder(data)
  paradigms = blimp.read(where, pairs or (FAST_PAIRS if fast else 0))
  done = os.path.join(out, "blimp", RESULT_FILE)
  total = sum(len(p.good) for p in paradigms)
  depends = dict(identity or {}, pairs=total)
  if os.path.exists(done):
    with open(done, encoding="utf-8") as f:
      result = json.load(f)
    if result.get("depends_on") == depends:
      log(f"[downstream] blimp: done before, accuracy {100 * result['overall']:.1f} (skipped)")
      return result
    saved = result.get("depends_on")
    what = differs(saved, depends) if saved else "no record of the model it scored"
    log(f"[downstream] blimp: the kept result is of another model or subset ({what}); scoring again")
  try:
    lm = load_masked_lm(init_from, source, random_init)
    scorer, params = scorer_for(lm)
  except UserError as e:
    raise type(e)(f"blimp: {e}") from None
  log(f"[downstream] blimp: started ({total} pairs, {len(paradigms)} paradigms)")
  result = zeroshot.blimp(scorer, params, paradigms)
  result.update(published=blimp.published(where), source=lm.source, depends_on=depends)
  os.makedirs(os.path.dirname(done), exist_ok=True)
  with open(done + ".tmp", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  os.replace(done + ".tmp", done)
  if result["too_long"]:
    log(f"[downstream] blimp: {result['too_long']} pairs have a sentence longer than the model's "
        f"{result['longest']} tokens: counted wrong")
  log(f"[downstream] blimp: finished, accuracy {100 * result['overall']:.1f} ({result['seconds']:.0f} s)")
  return result
