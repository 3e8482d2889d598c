"""Sparse MLM loss and metrics over the gathered prediction slots.

The vocabulary projection runs only for the `max_predictions` slots of each sequence, never for
all positions: with a 250k vocabulary that is most of XLM-R's FLOPs and memory. Log-softmax is taken
in float32 whatever the compute dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gather_slots(hidden, positions):
  """[B, S, H] hidden states at [B, P] positions -> [B, P, H]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def mlm_loss_and_metrics(logits, labels, weights):
  """Weighted cross-entropy over slots; returns (mean loss, sums for metrics).

  The sums (not means) are returned so that metrics add up exactly across microbatches, steps and
  hosts before the one division at logging time.
  """
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  n = weights.sum()
  loss_sum = (nll * weights).sum()
  sums = dict(loss_sum=loss_sum, correct_sum=(correct * weights).sum(), num_predictions=n)
  return loss_sum / jnp.maximum(n, 1.0), sums


def summarize(sums):
  """Sums -> loss, masked-token accuracy, perplexity, number of predictions."""
  n = jnp.maximum(sums["num_predictions"], 1.0)
  loss = sums["loss_sum"] / n
  return dict(loss=loss, accuracy=sums["correct_sum"] / n, perplexity=jnp.exp(loss),
              num_predictions=sums["num_predictions"])
