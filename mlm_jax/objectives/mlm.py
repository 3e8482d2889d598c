"""Masked LM (BERT / RoBERTa / XLM-R): dynamic masking inside the step, the loss over the prediction
slots only (sparse_loss.py). `MLM` is the description (interface.py's defaults) with `MLMStep`; the
other objectives' steps subclass MLMStep.
"""
from __future__ import annotations

import math

import ml_collections

from mlm_jax.objectives import masking
from mlm_jax.config import curricula
from mlm_jax.errors import ConfigError
from mlm_jax.objectives import sparse_loss
from mlm_jax.objectives.interface import Description


def z_loss_weight(config: ml_collections.ConfigDict) -> float:
  """loss.z_loss (0 = off)."""
  z = float(config.loss.z_loss)
  if z < 0:
    raise ConfigError(f"loss.z_loss={z}: expected >= 0 (PaLM uses 1e-4; 0 = off)")
  return z


class MLMStep:
  """The masked-LM step: masking at the scheduled rate, the MLM head on the prediction slots."""
  count_key = "num_predictions"

  def __init__(self, config: ml_collections.ConfigDict):
    self.masking, self.vocab_size = config.masking, config.model.vocab_size
    self.z_loss = z_loss_weight(config)

  def mask_rate_at(self, step, values=None):
    """The schedule's rate for `step` (traced; None at eval), else the step's mask rate (`values`, or
    masking.mask_rate when None)."""
    return curricula.mask_rate(self.masking, step, traced=True, rate=None if values is None else values.mask_rate)

  def prepare(self, batch, key, step=None, values=None):
    """Masks at the step's mask rate, or at the schedule's rate for `step`."""
    return masking.mask_batch(batch, key, self.masking, self.vocab_size, rate=self.mask_rate_at(step, values))

  def schedule_values(self, step: int) -> dict:
    if not self.masking.mask_rate_schedule:
      return {}
    return dict(mask_rate=float(curricula.mask_rate(self.masking, step)))

  @staticmethod
  def hidden_and_sums(model, batch, dropout_key, activation_sharding=None, values=None):
    """(hidden states, MLM metric sums over the prediction slots): what objectives built on MLM extend."""
    hidden = model(batch["input_ids"], batch["segment_ids"], batch["positions"], batch.get("token_type_ids"),
                   dropout_key=dropout_key, activation_sharding=activation_sharding, step_values=values)
    y = model.mlm_transform(sparse_loss.gather_slots(hidden, batch["masked_positions"]))
    return hidden, sparse_loss.mlm_sums(y, model.word_embeddings[...], model.decoder_bias[...],
                                        batch["masked_labels"], batch["masked_weights"], model.matmul_mode)

  def lm_loss(self, sums):
    """The LM head's summed loss: cross-entropy, plus loss.z_loss x log(Z)^2 over the same slots (PaLM)."""
    return sums["loss_sum"] + self.z_loss * sums["z_loss_sum"] if self.z_loss else sums["loss_sum"]

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None, values=None):
    _, sums = self.hidden_and_sums(model, batch, dropout_key, activation_sharding, values)
    return self.lm_loss(sums), sums

  def evaluate(self, model, batch, key, activation_sharding=None, values=None):
    """Metric sums with masks from `key` (fixed across evaluations, so they are comparable)."""
    return self.loss_sums(model, self.prepare(batch, key, None, values), None, activation_sharding, values)[1]

  def summarize(self, sums) -> dict:
    n = max(float(sums["num_predictions"]), 1.0)
    return dict(loss=float(sums["loss_sum"]) / n, accuracy=float(sums["correct_sum"]) / n, **self.z_summary(sums))

  def z_summary(self, sums) -> dict:
    """{'z_loss': mean log(Z)^2 of the predicted slots} when loss.z_loss is on (the term before its weight)."""
    return dict(z_loss=float(sums["z_loss_sum"]) / max(float(sums["num_predictions"]), 1.0)) if self.z_loss else {}

  def summarize_eval(self, sums) -> dict:
    """The held-out report: the rates plus the masked LM's perplexity."""
    n = max(float(sums["num_predictions"]), 1.0)
    mlm_loss = float(sums["loss_sum"]) / n
    return {**dict(loss=mlm_loss, accuracy=float(sums["correct_sum"]) / n, perplexity=math.exp(mlm_loss)),
            **self.summarize(sums)}

  @staticmethod
  def console(m: dict) -> str:
    return f"loss {m['loss']:.4f}  acc {m['accuracy']:.3f}"


class MLM(Description):
  """The masked-LM objective: every answer interface.Description's."""
  step = MLMStep
