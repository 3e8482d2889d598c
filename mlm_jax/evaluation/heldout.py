"""Held-out masked-LM metrics: the objective's eval step summed over batches with masks from one fixed
key (so every evaluation of a run, and every checkpoint, sees the same masks), then its rates."""
from __future__ import annotations

from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from mlm_jax.errors import DataError
from mlm_jax.model import sharding

EVAL_KEY_SALT = 2**31 - 1   # folded into the run's seed: the eval masks never repeat a training step's


def eval_key(seed: int):
  return jax.random.fold_in(jax.random.key(seed), EVAL_KEY_SALT)


def summed(objective, eval_step: Callable, params, batches: Iterable[dict], key, values=None) -> dict:
  """`eval_step(params, batch, key, values)` summed over `batches`, on the host; an error when nothing was
  scored. `values`: the step values (config/step_values.py; None: the config's constants)."""
  sums = None
  for batch in batches:
    s = eval_step(params, batch, key, values)
    sums = s if sums is None else jax.tree.map(jnp.add, sums, s)
  host = jax.device_get(sums) if sums is not None else None
  if host is None or host[objective.count_key] == 0:
    raise DataError("the eval split produced no batch (check data.eval_sources / data.eval_percent)")
  return host


def rates(objective, sums: dict) -> dict:
  """{'eval_<rate>': value}: the objective's held-out report of summed metrics."""
  return {f"eval_{k}": float(v) for k, v in getattr(objective, "summarize_eval", objective.summarize)(sums).items()}


def by_source(config, make: Callable) -> dict:
  """{name: make(config of that source's eval split alone)} for each source of a run's eval split
  (data/inputs.py eval_parts: two or more), with train.eval_per_source; `make` builds an eval pipeline."""
  from mlm_jax.data import inputs
  if not config.train.get("eval_per_source", True):
    return {}
  return {name: make(c) for name, c in inputs.eval_parts(config).items()}


class HeldOut:
  """The training loop's evaluator: `train.eval_batches` global batches of the eval split, or, with
  `by_source` ({name: pipeline}, data/inputs.py eval_parts), as many of each source's own eval split, logged
  as `eval_<rate>/<name>` (a source without held-out rows logs none), and the totals pooled over them. The
  eval split reads its sources one after another, so its first batches are all the first source's: without
  the pooling a multilingual run's totals would be its first language's, and the whole split is not read
  (`pipeline` may be None then).

  Every process runs exactly that many steps (collectives must line up); a process whose eval shard
  runs out feeds all-padding rows, which carry no predictions. The pipelines are built before training,
  so a missing or empty eval split fails at start, not after the run has trained; they are read only
  when evaluating, and rewound after each evaluation.
  """

  def __init__(self, trainer, tok, pipeline, by_source: dict | None = None):
    self.trainer, self.tok, self.pipeline = trainer, tok, pipeline
    self.by_source = dict(by_source or {})
    self.key = eval_key(trainer.config.seed)

  def _batches(self, pipeline):
    config = self.trainer.config
    rows = config.train.batch_size // jax.process_count()
    filler = {k: np.full((rows, *shape), self.tok.pad_id if k == "input_ids" else 0, np.int32)   # no loss
              for k, shape in self.trainer.description.batch_features(config.data.seq_len).items()}
    for _ in range(config.train.eval_batches):
      yield sharding.global_batch(next(pipeline, filler), self.trainer.batch_sharding)

  def _summed(self, params, pipeline) -> dict:
    try:
      return summed(self.trainer.objective, self.trainer.eval_step, params, self._batches(pipeline), self.key,
                    self.trainer.values)
    finally:
      pipeline.rewind()   # drops its reader, which would otherwise keep prefetching through training

  def __call__(self, params, step: int) -> dict:
    objective = self.trainer.objective
    if not self.by_source:
      return rates(objective, self._summed(params, self.pipeline))
    out, pooled = {}, None
    for name, pipeline in self.by_source.items():
      try:
        sums = self._summed(params, pipeline)
      except DataError:   # no held-out rows of this source: the others say what there is
        continue
      out.update({f"{k}/{name}": v for k, v in rates(objective, sums).items()})
      pooled = sums if pooled is None else jax.tree.map(np.add, pooled, sums)
    if pooled is None:
      raise DataError("no source of the eval split has held-out rows "
                      "(check data.eval_sources / data.eval_percent)")
    return {**rates(objective, pooled), **out}
