"""AdamW as BERT/RoBERTa train it: warmup, then linear or cosine decay; no decay on biases or norms.
LAMB (`name='lamb'`): the same Adam step with its layer-wise trust ratio (GPT-BERT's optimizer).

Also ModernBERT's recipe: a warmup-stable-decay schedule (`schedule='wsd'`) and per-tensor update clipping
(`update_clip_rms`), the nearest optax equivalent of StableAdamW (how near: docs/design_notes.md#optim).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import ml_collections

from mlm_jax.config import choices
from mlm_jax.errors import ConfigError

SCHEDULES = choices.CHOICES["optimizer.schedule"]


def _decay(shape: str, peak: float, end: float, steps: int) -> optax.Schedule:
  """From `peak` at step 0 to `end` at `steps` (and after), with the given shape."""
  if shape == "linear":
    return optax.linear_schedule(peak, end, steps)
  if shape == "cosine":
    return optax.cosine_decay_schedule(peak, steps, alpha=end / peak if peak else 0.0)
  # 1-sqrt (Hägele et al., 2024): lr = end + (peak - end) * (1 - sqrt(t / steps)); ModernBERT's decay.
  return lambda t: end + (peak - end) * (1.0 - jnp.sqrt(jnp.clip(t / steps, 0.0, 1.0)))


def make_schedule(o: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over `warmup_steps`, then:

  linear / cosine  decay to peak * end_lr_ratio at `total_steps`;
  constant         the peak;
  wsd              the peak until the last round(decay_fraction * total_steps) steps, which decay to
                   peak * end_lr_ratio with `decay_shape` (linear, cosine or 1-sqrt).
  """
  choices.check("optimizer.schedule", o.schedule)
  warmup = max(0, min(int(o.warmup_steps), total_steps))
  peak, end = float(o.learning_rate), float(o.learning_rate) * float(o.end_lr_ratio)
  decay_steps = max(1, total_steps - warmup)
  if o.schedule == "linear":
    decay = optax.linear_schedule(peak, end, decay_steps)
  elif o.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=float(o.end_lr_ratio))
  elif o.schedule == "wsd":
    choices.check("optimizer.decay_shape", o.decay_shape)
    if not 0.0 <= float(o.decay_fraction) <= 1.0:
      raise ConfigError(f"optimizer.decay_fraction={o.decay_fraction}: expected a fraction of train.steps in [0, 1]")
    tail = min(int(round(float(o.decay_fraction) * total_steps)), total_steps - warmup)
    stable = total_steps - warmup - tail
    decay = optax.join_schedules([optax.constant_schedule(peak), _decay(o.decay_shape, peak, end, max(1, tail))],
                                 [stable])
  else:
    decay = optax.constant_schedule(peak)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def phased_schedule(run: ml_collections.ConfigDict, segments: list, total_steps: int) -> optax.Schedule:
  """One schedule over a run in phases (config.phases). `segments`: (start, end, optimizer config or
  None) per phase; a phase with a config runs `make_schedule` of it over its own steps (a re-warmup,
  a decay), one with None follows `run`'s schedule over the whole run at the global step."""
  whole = make_schedule(run, total_steps)
  parts = [make_schedule(o, end - start) if o is not None else (lambda s, start=start: whole(s + start))
           for start, end, o in segments]
  return optax.join_schedules(parts, [start for start, _, _ in segments[1:]]) if len(parts) > 1 else parts[0]


def _is_stacked(path) -> bool:
  """Whether a parameter is a stack of scanned layers (leading `layers` axis): under `layer_groups`."""
  return any(getattr(k, "key", getattr(k, "name", None)) == "layer_groups" for k in path)


def clip_update_rms(threshold: float) -> optax.GradientTransformation:
  """Scale each tensor's update (each layer's, for stacked parameters) down to an RMS of at most `threshold`."""

  def update(updates, state, params=None):
    del params

    def clip(path, u):
      axes = tuple(range(1, u.ndim)) if _is_stacked(path) and u.ndim > 1 else None
      rms = jnp.sqrt(jnp.mean(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=True))
      return u * jnp.minimum(1.0, threshold / jnp.maximum(rms, 1e-30)).astype(u.dtype)

    return jax.tree_util.tree_map_with_path(clip, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_trust_ratio() -> optax.GradientTransformation:
  """optax.scale_by_trust_ratio per tensor, and per layer for stacked (scanned) parameters, so a scanned
  model takes the steps of the unscanned one: update * ||w|| / ||update|| (1 where either norm is 0)."""

  def update(updates, state, params):
    def scale(path, u, p):
      axes = tuple(range(1, u.ndim)) if _is_stacked(path) and u.ndim > 1 else None
      norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes, keepdims=True))
      p_norm, u_norm = norm(p), norm(u)
      ratio = jnp.where((p_norm == 0) | (u_norm == 0), 1.0, p_norm / jnp.where(u_norm == 0, 1.0, u_norm))
      return u * ratio.astype(u.dtype)

    return jax.tree_util.tree_map_with_path(scale, updates, params), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def decay_mask(params):
  """True for weight matrices and embeddings; False for biases and LayerNorm scales/biases."""

  def keep(path, _):
    name = str(getattr(path[-1], "key", getattr(path[-1], "name", path[-1])))
    if name == "value" and len(path) > 1:   # an nnx Variable's value: look at the attribute name
      name = str(getattr(path[-2], "key", getattr(path[-2], "name", path[-2])))
    return not (name.endswith("bias") or name == "scale")

  return jax.tree_util.tree_map_with_path(keep, params)


def scale_by_adam_without_bias_correction(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's direction m / (sqrt(v) + eps) from the raw moments (BERT's and ELECTRA's reference).

  optax.scale_by_adam always corrects the moments; its state layout is kept, so only the update differs.
  """

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    direction = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return direction, optax.ScaleByAdamState(count=state.count + 1, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def make_optimizer(o: ml_collections.ConfigDict, total_steps: int,
                   schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """AdamW (or LAMB) of `o`; its learning rate `schedule`, or make_schedule(o, total_steps)."""
  name = o.get("name", "adamw")
  choices.check("optimizer.name", name)
  parts = []
  if o.clip_norm and o.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(float(o.clip_norm)))
  schedule = schedule or make_schedule(o, total_steps)
  clip_rms = float(o.get("update_clip_rms", 0.0))
  if clip_rms < 0:
    raise ConfigError(f"optimizer.update_clip_rms={clip_rms}: expected >= 0 (0 = off)")
  corrected = bool(o.get("bias_correction", True))
  # optax.adamw's own chain, with the clipping between the Adam direction and the weight decay; LAMB
  # (optax.lamb's chain) scales the decayed update of each weight matrix by its trust ratio. Checkpoints
  # that hold optax.adamw's state as one nested chain are read into this one by workdir/migrate.py.
  adam = optax.scale_by_adam if corrected else scale_by_adam_without_bias_correction
  parts += [adam(b1=float(o.b1), b2=float(o.b2), eps=float(o.eps))]
  parts += [clip_update_rms(clip_rms)] if clip_rms > 0 else []
  parts += [optax.add_decayed_weights(float(o.weight_decay), mask=decay_mask)]
  parts += [optax.masked(scale_by_trust_ratio(), decay_mask)] if name == "lamb" else []
  parts += [optax.scale_by_learning_rate(schedule)]
  return optax.chain(*parts)
