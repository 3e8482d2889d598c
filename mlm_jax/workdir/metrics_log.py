"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard, from process 0.

On resume the jsonl file is cut back to the restored step, so it always holds one line per logged
step of the run's real history (a crash after the last checkpoint leaves no orphan lines).
"""
from __future__ import annotations

import json
import os


class MetricsWriter:

  def __init__(self, workdir: str, enabled: bool = True, truncate_after: int | None = None):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    self.max_step_before = 0   # the newest step the file held before it was cut back (a killed run's last log)
    if not enabled:
      return
    import tensorflow as tf
    self._tf = tf
    if truncate_after is not None and tf.io.gfile.exists(self.path):
      with tf.io.gfile.GFile(self.path) as f:
        lines = [l for l in f if l.strip()]
      steps = [json.loads(l).get("step", 0) for l in lines]
      self.max_step_before = max(steps, default=0)
      kept = [l for l, s in zip(lines, steps) if s <= truncate_after]
      with tf.io.gfile.GFile(self.path, "w") as f:
        f.write("".join(kept))
    self._file = tf.io.gfile.GFile(self.path, "a")
    self._tb = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

  def write(self, metrics: dict) -> None:
    if not self.enabled:
      return
    self._file.write(json.dumps(metrics, sort_keys=True) + "\n")
    self._file.flush()
    step = int(metrics["step"])
    with self._tb.as_default():
      for k, v in metrics.items():
        if k != "step" and isinstance(v, (int, float)):
          self._tf.summary.scalar(k, v, step=step)
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._file.close()
      self._tb.close()
