"""MLM plus a sentence-level binary task: BERT's next-sentence prediction or ALBERT's sentence order.

`config.objective = 'mlm+nsp' | 'mlm+sop'` trains on sentence pairs from a token store
(data/store/pairs.py) with BERT's pooler and 2-way head; loss = mean MLM + mean sentence loss.
How the two means combine under accumulation: docs/design_notes.md#sentence.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mlm_jax.objectives.interface import Description
from mlm_jax.objectives.mlm import MLMStep


def sentence_sums(logits, labels, weights) -> dict:
  """Summed cross-entropy and top-1 hits of [B, 2] logits against [B] labels, weighted per row."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
  hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return dict(sentence_loss_sum=(nll * weights).sum(), sentence_correct_sum=(hit * weights).sum(),
              num_pairs=weights.sum())


class SentenceStep(MLMStep):
  """MLM's step (dynamic masking, sparse slots, mask-rate schedule) + the NSP / SOP head on the pooler."""

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None, values=None):
    hidden, sums = self.hidden_and_sums(model, batch, dropout_key, activation_sharding, values)
    weights = (batch["segment_ids"][:, 0] > 0).astype(jnp.float32)
    sums.update(sentence_sums(model.sentence_logits(hidden), batch["sentence_labels"], weights))
    scale = jax.lax.stop_gradient(sums["num_predictions"] / jnp.maximum(sums["num_pairs"], 1.0))
    return self.lm_loss(sums) + scale * sums["sentence_loss_sum"], sums

  def summarize(self, sums) -> dict:
    n = max(float(sums["num_pairs"]), 1.0)
    return dict(super().summarize(sums), sentence_loss=float(sums["sentence_loss_sum"]) / n,
                sentence_accuracy=float(sums["sentence_correct_sum"]) / n)

  @staticmethod
  def console(m: dict) -> str:
    return f"{MLMStep.console(m)}  sent loss {m['sentence_loss']:.4f}  sent acc {m['sentence_accuracy']:.3f}"


class MLMWithSentenceHead(Description):
  """MLM + a sentence head: the pooler and the head are the objective's, sentence pairs its input."""
  step = SentenceStep

  @classmethod
  def bind(cls, config) -> None:
    config.model.use_pooler = config.model.sentence_head = True

  @classmethod
  def batch_features(cls, seq_len: int) -> dict:
    return dict(super().batch_features(seq_len), token_type_ids=(seq_len,), sentence_labels=())


class NextSentence(MLMWithSentenceHead):
  """BERT: is B the span that followed A, or one from another document?"""
  input_kind = "nsp_pairs"


class SentenceOrder(MLMWithSentenceHead):
  """ALBERT: are A and B in their order, or swapped?"""
  input_kind = "sop_pairs"
