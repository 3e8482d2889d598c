"""Task heads on the shared encoder, and their losses: the model that fine-tuning trains.

`TaskModel` = the pretrained `Encoder` under `encoder.` (a pretraining checkpoint drops in unchanged)
+ one head under `head.`: `sequence` (BERT's pooler or RoBERTa's classification head), `token`, or
`span` (QA start/end). Head by head: docs/design_notes.md#heads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
import ml_collections

from mlm_jax.config import choices
from mlm_jax.model.encoder import Encoder, dropout

KINDS = choices.CHOICES["task.kind"]


def _param(key, shape, names, std: float, dtype) -> nnx.Param:
  value = std * jax.random.normal(key, shape, dtype) if key is not None else jnp.zeros(shape, dtype)
  with nnx.use_eager_sharding(False):
    return nnx.Param(value, out_sharding=names)


class Dense(nnx.Module):
  """x @ kernel + bias; the output axis is replicated (a handful of labels is not worth sharding)."""

  def __init__(self, din: int, dout: int, key, std: float, dtype, out_name=None):
    self.kernel = _param(key, (din, dout), ("embed", out_name), std, dtype)
    self.bias = _param(None, (dout,), (out_name,), 0.0, dtype)

  def __call__(self, x):
    return x @ self.kernel[...].astype(x.dtype) + self.bias[...].astype(x.dtype)


class SequenceHead(nnx.Module):

  def __init__(self, cfg: ml_collections.ConfigDict, num_outputs: int, key, dtype):
    h, std = cfg.hidden_size, cfg.initializer_range
    kd, ko = jax.random.split(key)
    self.use_pooler = bool(cfg.use_pooler)
    if not self.use_pooler:
      self.dense = Dense(h, h, kd, std, dtype, out_name="norm")
    self.out_proj = Dense(h, num_outputs, ko, std, dtype)

  def __call__(self, encoder: Encoder, hidden, rate: float, key):
    k1, k2 = (None, None) if key is None else tuple(jax.random.split(key))
    if self.use_pooler:
      return self.out_proj(dropout(encoder.pool(hidden), rate, k1))
    x = jnp.tanh(self.dense(dropout(hidden[:, 0], rate, k1)))
    return self.out_proj(dropout(x, rate, k2))


class TokenHead(nnx.Module):

  def __init__(self, cfg: ml_collections.ConfigDict, num_outputs: int, key, dtype):
    self.out_proj = Dense(cfg.hidden_size, num_outputs, key, cfg.initializer_range, dtype)

  def __call__(self, encoder: Encoder, hidden, rate: float, key):
    return self.out_proj(dropout(hidden, rate, key))


class SpanHead(nnx.Module):

  def __init__(self, cfg: ml_collections.ConfigDict, num_outputs: int, key, dtype):
    del num_outputs
    self.out_proj = Dense(cfg.hidden_size, 2, key, cfg.initializer_range, dtype)

  def __call__(self, encoder: Encoder, hidden, rate: float, key):
    del rate, key   # BERT's SQuAD head has no dropout of its own
    logits = self.out_proj(hidden)
    return logits[..., 0], logits[..., 1]


_HEADS = dict(classification=SequenceHead, regression=SequenceHead, token=TokenHead, qa=SpanHead)


class TaskModel(nnx.Module):
  """Encoder + one head. `__call__(batch, dropout_key=None)` -> float32 logits (a pair for QA)."""

  def __init__(self, cfg: ml_collections.ConfigDict, kind: str, num_labels: int, *, seed: int = 0,
               head_dropout: float = -1.0):
    choices.check("task.kind", kind)
    self.kind = kind
    self.encoder = Encoder(cfg, seed=seed)
    # A separate stream for the head, so its initialization does not depend on the encoder's size.
    key = jax.random.fold_in(jax.random.key(seed), 0x4EAD)
    self.head = _HEADS[kind](cfg, 1 if kind == "regression" else num_labels, key, jnp.dtype(cfg.param_dtype))
    self.head_dropout = float(cfg.hidden_dropout if head_dropout < 0 else head_dropout)

  def __call__(self, batch: dict, dropout_key=None, step_values=None):
    """`step_values`: the trainer's step's (config/step_values.py), for the encoder; None: the config's."""
    enc_key = head_key = None
    if dropout_key is not None:
      enc_key, head_key = jax.random.split(dropout_key)
    hidden = self.encoder(batch["input_ids"], batch["segment_ids"], batch["positions"],
                          batch.get("token_type_ids"), dropout_key=enc_key, step_values=step_values)
    out = self.head(self.encoder, hidden, self.head_dropout, head_key)
    return jax.tree.map(lambda x: x.astype(jnp.float32), out)


def _xent(logits, labels):
  """Per-row cross-entropy; labels < 0 give 0 (and are counted out by the caller's weights)."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
  return -picked


def loss_sums(kind: str, outputs, batch: dict) -> tuple[jax.Array, jax.Array]:
  """(summed loss, number of terms) over the batch; padding rows (`weight` 0) and ignored labels count 0.

  Sums rather than means, so that gradients of the global batch do not depend on how it is split.
  """
  w = batch["weight"].astype(jnp.float32)
  if kind == "classification":
    return (_xent(outputs, batch["label"]) * w).sum(), w.sum()
  if kind == "regression":
    return (jnp.square(outputs[:, 0] - batch["target"]) * w).sum(), w.sum()
  if kind == "token":
    labels = batch["labels"]
    tw = (labels >= 0).astype(jnp.float32) * w[:, None]
    return (_xent(outputs, labels) * tw).sum(), tw.sum()
  start, end = outputs
  per_row = 0.5 * (_xent(start, batch["start_position"]) + _xent(end, batch["end_position"]))
  return (per_row * w).sum(), w.sum()


class TaskObjective:
  """Fine-tuning as an objective of trainer.make_trainer: no input transform, the head's loss, and the
  model's outputs (float32 logits) as what the eval step returns."""
  count_key = "count"

  def __init__(self, kind: str):
    self.kind = kind

  def prepare(self, batch, key, step=None, values=None):
    return batch

  def loss_sums(self, model, batch, dropout_key, activation_sharding=None, values=None):
    loss_sum, count = loss_sums(self.kind, model(batch, dropout_key=dropout_key, step_values=values), batch)
    return loss_sum, dict(loss_sum=loss_sum, count=count)

  def evaluate(self, model, batch, key, activation_sharding=None, values=None):
    return model(batch, step_values=values)

  @staticmethod
  def summarize(sums) -> dict:
    return dict(loss=float(sums["loss_sum"]) / max(float(sums["count"]), 1.0))

  @staticmethod
  def console(m: dict) -> str:
    return f"loss {m['loss']:.4f}  {m['examples_per_sec']:.1f} examples/s"
