"""GPT-BERT (Charpentier & Samuel, 2024, arXiv:2410.24159): masked and causal LM in one model, `objective='gpt_bert'`.

Masked next-token prediction (MNTP): rows are masked as for MLM (every `masking.*` option; GPT-BERT's
own is `mode='span_uniform'`, `span_max=3`, the rate falling 30% -> 15%), and the token of a masked slot
at position t is predicted from the output at t - 1. So the one LM head predicts "the next token" in
both kinds of rows: the last round(gpt_bert.causal_share x rows) rows of each (micro)batch are fed
unmasked with causal attention and predict every next token of their documents. The loss is
(1 - c) x mean MNTP loss + c x mean causal loss, c that share (the reference's rank-weighted mean).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections

from mlm_jax.errors import ConfigError
from mlm_jax.model import flops
from mlm_jax.objectives import masking, sparse_loss
from mlm_jax.objectives.interface import Description
from mlm_jax.objectives.mlm import MLMStep

CAUSAL_KEYS = ("clm_loss_sum", "clm_correct_sum", "clm_predictions", "clm_z_loss_sum")


def micro_rows(config: ml_collections.ConfigDict) -> int:
  """Rows of each microbatch (what one loss_sums call sees): batch_size / grad_accum_steps."""
  return int(config.train.batch_size) // max(1, int(config.optimizer.grad_accum_steps))


def causal_rows(config: ml_collections.ConfigDict) -> int:
  """Causal rows in each microbatch: round(causal_share x its rows)."""
  return int(round(float(config.gpt_bert.causal_share) * micro_rows(config)))


def next_token_sums(model, hidden, input_ids, segment_ids) -> dict:
  """The LM head's sums for predicting each token from the position before it, within a document."""
  targets = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
  y = model.mlm_transform(hidden[:, :-1])
  sums = sparse_loss.mlm_sums(y, model.word_embeddings[...], model.decoder_bias[...], input_ids[:, 1:], targets,
                              model.matmul_mode)
  return dict(zip(CAUSAL_KEYS, (sums["loss_sum"], sums["correct_sum"], sums["num_predictions"], sums["z_loss_sum"])))


def readable_slots(masked: dict) -> dict:
  """`masked` with the slots that have no token before them in their document left out (weight 0): a row
  that starts inside a document (data.packing='concat'); rows of whole documents start with BOS."""
  pos, seg = masked["masked_positions"], masked["segment_ids"]
  before = jnp.take_along_axis(seg, jnp.maximum(pos - 1, 0), axis=1)
  ok = (pos > 0) & (before == jnp.take_along_axis(seg, pos, axis=1))
  return dict(masked, masked_weights=masked["masked_weights"] * ok)


def mntp_sums(model, hidden, batch) -> dict:
  """MLM's sums with each masked slot read from the position before it (readable_slots: one is there)."""
  before = jnp.maximum(batch["masked_positions"] - 1, 0)
  y = model.mlm_transform(sparse_loss.gather_slots(hidden, before))
  return sparse_loss.mlm_sums(y, model.word_embeddings[...], model.decoder_bias[...], batch["masked_labels"],
                              batch["masked_weights"], model.matmul_mode)


class GptBertStep(MLMStep):
  """The GPT-BERT step: MNTP on the masked rows, next-token prediction on the causal ones, one head."""

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self.accum = max(1, int(config.optimizer.grad_accum_steps))
    self.micro_rows, self.causal_rows = micro_rows(config), causal_rows(config)

  def prepare(self, batch, key, step=None, values=None):
    """MLM's masking (at the scheduled rate for `step`), then the last `causal_rows` rows of each microbatch
    back to their original tokens (causal rows are not masked; their masked slots are never read)."""
    out = readable_slots(masking.mask_batch(batch, key, self.masking, self.vocab_size,
                                            rate=self.mask_rate_at(step, values)))
    if self.causal_rows:
      out["input_ids"] = jnp.where(self._causal(batch["input_ids"].shape[0], self.accum)[:, None],
                                   batch["input_ids"], out["input_ids"])
    return out

  def _causal(self, rows: int, microbatches: int = 1):
    """[rows] bool: the last `causal_rows` rows of each of `microbatches` microbatches, which take every
    n-th row (microbatch i: rows i, i + n, ...; training/trainer.py `_microbatches`)."""
    per = rows // microbatches
    return jnp.arange(rows) // microbatches >= per - self.causal_rows

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None, values=None):
    rows, k = batch["input_ids"].shape[0], self.causal_rows
    hidden = model(batch["input_ids"], batch["segment_ids"], batch["positions"], batch.get("token_type_ids"),
                   dropout_key=dropout_key, activation_sharding=activation_sharding,
                   causal=self._causal(rows) if k else None, step_values=values)
    m = rows - k
    sums = mntp_sums(model, hidden[:m], {n: batch[n][:m] for n in ("masked_positions", "masked_labels",
                                                                   "masked_weights")})
    if not k:
      return self.lm_loss(sums), sums
    causal = next_token_sums(model, hidden[m:], batch["input_ids"][m:], batch["segment_ids"][m:])
    sums.update(causal)
    c = k / rows
    ratio = jax.lax.stop_gradient(sums["num_predictions"] / jnp.maximum(causal["clm_predictions"], 1.0))
    causal_loss = causal["clm_loss_sum"] + self.z_loss * causal["clm_z_loss_sum"]
    return (1 - c) * self.lm_loss(sums) + c * ratio * causal_loss, sums

  def evaluate(self, model, batch, key, activation_sharding=None, values=None):
    """Every held-out row twice: masked at the step's mask rate (masking.mask_rate: MNTP), and causal."""
    masked = readable_slots(masking.mask_batch(batch, key, self.masking, self.vocab_size,
                                               rate=self.mask_rate_at(None, values)))
    args = (batch["segment_ids"], batch["positions"], batch.get("token_type_ids"))
    sums = mntp_sums(model, model(masked["input_ids"], *args, activation_sharding=activation_sharding,
                                  step_values=values), masked)
    rows = batch["input_ids"].shape[0]
    hidden = model(batch["input_ids"], *args, activation_sharding=activation_sharding, causal=jnp.ones(rows, bool),
                   step_values=values)
    return dict(sums, **next_token_sums(model, hidden, batch["input_ids"], batch["segment_ids"]))

  def summarize(self, sums) -> dict:
    """MNTP's loss and accuracy (`mlm_loss`, `accuracy`), the causal rows' (`clm_*`), and `loss` their
    weighted sum as trained."""
    out = super().summarize(sums)
    out["mlm_loss"] = out["loss"]
    if "clm_predictions" in sums:
      n = max(float(sums["clm_predictions"]), 1.0)
      share = self.causal_rows / max(1, self.micro_rows)
      out.update(clm_loss=float(sums["clm_loss_sum"]) / n, clm_accuracy=float(sums["clm_correct_sum"]) / n)
      out["loss"] = (1 - share) * out["mlm_loss"] + share * out["clm_loss"]
    return out

  def summarize_eval(self, sums) -> dict:
    out = super().summarize_eval(sums)
    return dict(out, perplexity=math.exp(out["mlm_loss"]), clm_perplexity=math.exp(out["clm_loss"]))

  @staticmethod
  def console(m: dict) -> str:
    clm = f"  clm {m['clm_loss']:.4f} acc {m['clm_accuracy']:.3f}" if "clm_loss" in m else ""
    return f"loss {m['loss']:.4f}  mntp {m['mlm_loss']:.4f} acc {m['accuracy']:.3f}{clm}"


class GptBert(Description):
  """The GPT-BERT hybrid (interface.py); MLM's answers where the model is the plain encoder."""
  step = GptBertStep
  prediction_shift = 1   # PLL and fill-mask read a masked token at t from position t - 1

  @classmethod
  def bind(cls, config: ml_collections.ConfigDict) -> None:
    if config.model.attention_impl == "auto":
      config.model.attention_impl = "xla"   # causal rows need its dense masks

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    super().check(config)
    share = float(config.gpt_bert.causal_share)
    if not 0.0 <= share < 1.0:
      raise ConfigError(f"gpt_bert.causal_share={share}: expected a fraction in [0, 1) of each batch's rows")
    micro = micro_rows(config)
    if share > 0 and not 0 < causal_rows(config) < micro:
      raise ConfigError(f"gpt_bert.causal_share={share} of {micro} rows a microbatch gives {causal_rows(config)} "
                        f"causal rows: expected at least 1 and fewer than {micro} (raise train.batch_size)")
    if config.model.attention_impl not in ("auto", "xla"):
      raise ConfigError(f"model.attention_impl={config.model.attention_impl}: objective=gpt_bert trains causal rows, "
                        "which only xla serves")

  @classmethod
  def flops_per_token(cls, config: ml_collections.ConfigDict, seq_len: int, num_slots: int) -> float:
    """The encoder on every token, the head on the masked rows' slots and on every position of the causal rows."""
    c = causal_rows(config) / micro_rows(config)
    return flops.flops_per_token(config.model, seq_len, (1 - c) * num_slots + c * (seq_len - 1))
