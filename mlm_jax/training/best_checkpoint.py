"""train.best_metric: the best parameters by one eval metric, kept in WORKDIR/best beside the run's checkpoints."""
from __future__ import annotations

import os

from mlm_jax.errors import ConfigError
from mlm_jax.workdir import checkpoints


class BestCheckpoint:
  """The best parameters by one eval metric (higher is better) in WORKDIR/best; its progress is saved
  with every checkpoint, so a resumed run keeps comparing against the same best."""

  def __init__(self, workdir: str, metric: str):
    self.metric, self.value, self.step = metric, None, None
    self.checkpointer = checkpoints.Checkpointer(os.path.join(workdir, "best"), keep=1)

  def update(self, state, step: int, metrics: dict) -> None:
    value = metrics.get(self.metric)
    if value is None:
      raise ConfigError(f"train.best_metric={self.metric[5:]!r} is not an eval metric of this run: "
                        f"{', '.join(k[5:] for k in metrics)}")
    if self.value is None or value > self.value:
      self.value, self.step = value, step
      self.checkpointer.save(step, {"params": state.params}, self.get_state())

  def get_state(self) -> dict:
    return dict(best=self.value, best_step=self.step)

  def set_state(self, state: dict) -> None:
    self.value, self.step = state.get("best"), state.get("best_step")
