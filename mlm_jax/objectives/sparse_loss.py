"""Sparse MLM loss and metrics over the gathered prediction slots.

The vocabulary projection runs only on the `max_predictions` slots, never on every position, in float32
log-softmax; projection + cross-entropy are one custom-VJP function over [vocab, slots] logits, so the
backward pass needs no transposed copy (why: docs/design_notes.md#sparse_loss). It also sums PaLM's
z-loss term log(Z)^2 per slot (Z the softmax's normalizer), which `loss.z_loss` weighs into the loss.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mlm_jax.model import matmul as matmul_lib


def gather_slots(hidden, positions):
  """[B, S, H] hidden states at [B, P] positions -> [B, P, H]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def _logits_t(y, embeddings, bias, matmul):
  """[V, N] float32 logits of N slot vectors y [N, H] against the tied embeddings [V, H]."""
  z = matmul_lib.dot_f32("vh,nh->vn", embeddings.astype(y.dtype), y, matmul)
  return z + bias.astype(jnp.float32)[:, None]


def _label_onehot(labels, vocab):
  return jax.lax.broadcasted_iota(jnp.int32, (vocab, labels.shape[0]), 0) == labels[None, :]


def _stats(z, labels):
  m = z.max(axis=0)
  lse = m + jnp.log(jnp.exp(z - m[None, :]).sum(axis=0))
  label_logit = z[labels, jnp.arange(z.shape[1])]
  return m, lse, label_logit


def _sums(z, labels, weights):
  m, lse, label_logit = _stats(z, labels)
  return ((lse - label_logit) * weights).sum(), ((label_logit >= m) * weights).sum(), (lse * lse * weights).sum(), lse


def sparse_cross_entropy(y, embeddings, bias, labels, weights, matmul: str = "xla"):
  """(sum of weighted NLL, sum of weighted top-1 hits, sum of weighted log(Z)^2) for slot vectors y [N, H]
  and labels [N]; `matmul`: model.matmul (mlm_jax/model/matmul.py), how the projection's matmuls are written."""
  return _xent(matmul, y, embeddings, bias, labels, weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _xent(matmul, y, embeddings, bias, labels, weights):
  return _sums(_logits_t(y, embeddings, bias, matmul), labels, weights)[:3]


def _xent_fwd(matmul, y, embeddings, bias, labels, weights):
  z = _logits_t(y, embeddings, bias, matmul)
  nll, hits, zsq, lse = _sums(z, labels, weights)
  return (nll, hits, zsq), (y, embeddings, bias, labels, weights, z, lse)


def _xent_bwd(matmul, res, g):
  y, embeddings, bias, labels, weights, z, lse = res
  # d NLL / dz = softmax - onehot; d log(Z)^2 / dz = 2 log(Z) softmax
  prob_scale = (g[0] + 2.0 * g[2] * lse) * weights                           # [N]
  dz = jnp.exp(z - lse[None, :]) * prob_scale[None, :] - _label_onehot(labels, z.shape[0]) * (g[0] * weights)[None, :]
  dz_c = dz.astype(y.dtype)
  d_emb = matmul_lib.dot_f32("vn,nh->vh", dz_c, y, matmul).astype(embeddings.dtype)
  d_y = matmul_lib.dot_f32("vn,vh->nh", dz_c, embeddings.astype(y.dtype), matmul)
  d_bias = dz.sum(axis=1).astype(bias.dtype)
  return d_y.astype(y.dtype), d_emb, d_bias, None, jnp.zeros_like(weights)


_xent.defvjp(_xent_fwd, _xent_bwd)


def mlm_sums(y, embeddings, bias, labels, weights, matmul: str = "xla"):
  """Metric sums for [..., H] slot vectors; flattens the slot dimensions."""
  h = y.shape[-1]
  y, labels, weights = y.reshape(-1, h), labels.reshape(-1), weights.reshape(-1).astype(jnp.float32)
  loss_sum, correct_sum, z_sum = sparse_cross_entropy(y, embeddings, bias, labels, weights, matmul)
  return dict(loss_sum=loss_sum, correct_sum=correct_sum, num_predictions=weights.sum(), z_loss_sum=z_sum)


def summarize(sums):
  """Sums -> loss, masked-token accuracy, perplexity, number of predictions."""
  n = jnp.maximum(sums["num_predictions"], 1.0)
  loss = sums["loss_sum"] / n
  return dict(loss=loss, accuracy=sums["correct_sum"] / n, perplexity=jnp.exp(loss),
              num_predictions=sums["num_predictions"])
