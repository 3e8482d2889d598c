"""Masked LM (BERT / RoBERTa / XLM-R): dynamic masking inside the step, the loss over the prediction
slots only (sparse_loss.py). The other objectives subclass it; its class methods are every
objective's default answers (interface.py).
"""
from __future__ import annotations

import math

import ml_collections

from mlm_jax.model import flops
from mlm_jax.objectives import masking
from mlm_jax.config import curricula
from mlm_jax.errors import ConfigError
from mlm_jax.model.encoder import Encoder
from mlm_jax.objectives import sparse_loss

ROW_FEATURES = ("input_ids", "segment_ids", "positions", "word_starts")   # a packed row (data/)


def z_loss_weight(config: ml_collections.ConfigDict) -> float:
  """loss.z_loss (0 = off; configs written before the field have none)."""
  z = float(config.get("loss", {}).get("z_loss", 0.0))
  if z < 0:
    raise ConfigError(f"loss.z_loss={z}: expected >= 0 (PaLM uses 1e-4; 0 = off)")
  return z


class MLM:
  """The masked-LM objective: masking at the scheduled rate, the MLM head on the prediction slots."""
  input_kind = "rows"
  count_key = "num_predictions"
  prediction_shift = 0   # the LM head reads a masked token at t from position t - prediction_shift

  # --- asked before the run ---
  @classmethod
  def bind(cls, config: ml_collections.ConfigDict) -> None:
    pass

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    if not config.model.get("mlm_head", True):
      raise ConfigError(f"model.mlm_head=False (an ELECTRA discriminator): objective={config.objective!r} needs "
                        "the MLM head; fine-tune it with mlm_jax.finetune instead")

  @classmethod
  def towers(cls, config: ml_collections.ConfigDict) -> dict:
    return {}

  @classmethod
  def batch_features(cls, seq_len: int) -> dict:
    return {k: (seq_len,) for k in ROW_FEATURES}

  @classmethod
  def flops_per_token(cls, config: ml_collections.ConfigDict, seq_len: int, num_slots: int) -> float:
    return flops.flops_per_token(config.model, seq_len, num_slots)

  @classmethod
  def make_model(cls, config: ml_collections.ConfigDict):
    return Encoder(config.model, seed=config.seed)

  @classmethod
  def encoder(cls, config: ml_collections.ConfigDict) -> tuple:
    return "", config.model

  @classmethod
  def masked_lm(cls, config: ml_collections.ConfigDict) -> tuple:
    return "", config.model

  @classmethod
  def to_hf(cls, workdir: str, out: str, step, arch, ema: bool = False):
    return None

  # --- the step ---
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
    if not self.masking.get("mask_rate_schedule", ()):
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
