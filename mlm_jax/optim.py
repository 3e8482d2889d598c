"""AdamW as BERT/RoBERTa train it: warmup, then linear or cosine decay; no decay on biases or norms."""
from __future__ import annotations

import jax
import optax
import ml_collections

from mlm_jax import choices

SCHEDULES = choices.CHOICES["optimizer.schedule"]


def make_schedule(o: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  choices.check("optimizer.schedule", o.schedule)
  warmup = max(0, min(int(o.warmup_steps), total_steps))
  peak, end = float(o.learning_rate), float(o.learning_rate) * float(o.end_lr_ratio)
  decay_steps = max(1, total_steps - warmup)
  if o.schedule == "linear":
    decay = optax.linear_schedule(peak, end, decay_steps)
  elif o.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=float(o.end_lr_ratio))
  else:
    decay = optax.constant_schedule(peak)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def decay_mask(params):
  """True for weight matrices and embeddings; False for biases and LayerNorm scales/biases."""

  def keep(path, _):
    name = str(getattr(path[-1], "key", getattr(path[-1], "name", path[-1])))
    if name == "value" and len(path) > 1:   # an nnx Variable's value: look at the attribute name
      name = str(getattr(path[-2], "key", getattr(path[-2], "name", path[-2])))
    return not (name.endswith("bias") or name == "scale")

  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(o: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  parts = []
  if o.clip_norm and o.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(float(o.clip_norm)))
  parts.append(optax.adamw(make_schedule(o, total_steps), b1=float(o.b1), b2=float(o.b2), eps=float(o.eps),
                           weight_decay=float(o.weight_decay), mask=decay_mask))
  return optax.chain(*parts)
