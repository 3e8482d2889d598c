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


def summed(objective, eval_step: Callable, params, batches: Iterable[dict], key) -> dict:
  """`eval_step(params, batch, key)` summed over `batches`, on the host; an error when nothing was scored."""
  sums = None
  for batch in batches:
    s = eval_step(params, batch, key)
    sums = s if sums is None else jax.tree.map(jnp.add, sums, s)
  host = jax.device_get(sums) if sums is not None else None
  if host is None or host[objective.count_key] == 0:
    raise DataError("the eval split produced no batch (check data.eval_sources / data.eval_percent)")
  return host


def rates(objective, sums: dict) -> dict:
  """{'eval_<rate>': value}: the objective's held-out report of summed metrics."""
  return {f"eval_{k}": float(v) for k, v in getattr(objective, "summarize_eval", objective.summarize)(sums).items()}


class HeldOut:
  """The training loop's evaluator: `train.eval_batches` global batches of the eval split.

  Every process runs exactly that many steps (collectives must line up); a process whose eval shard
  runs out feeds all-padding rows, which carry no predictions. The pipeline is built before training,
  so a missing or empty eval split fails at start, not after the run has trained; it is read only
  when evaluating, and rewound after each evaluation.
  """

  def __init__(self, trainer, tok, pipeline):
    self.trainer, self.tok, self.pipeline = trainer, tok, pipeline
    self.key = eval_key(trainer.config.seed)

  def _batches(self):
    config = self.trainer.config
    rows = config.train.batch_size // jax.process_count()
    filler = {k: np.full((rows, *shape), self.tok.pad_id if k == "input_ids" else 0, np.int32)   # no loss
              for k, shape in self.trainer.objective.batch_features(config.data.seq_len).items()}
    for _ in range(config.train.eval_batches):
      yield sharding.global_batch(next(self.pipeline, filler), self.trainer.batch_sharding)

  def __call__(self, params, step: int) -> dict:
    try:
      objective = self.trainer.objective
      return rates(objective, summed(objective, self.trainer.eval_step, params, self._batches(), self.key))
    finally:
      self.pipeline.rewind()   # drops its reader, which would otherwise keep prefetching through training
