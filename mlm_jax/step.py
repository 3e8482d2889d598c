"""The pure train and eval steps: mask -> encoder -> gather slots -> MLM head -> loss -> AdamW.

`train_step(state, batch, key) -> (state, metrics)` is one jax.jit with the state donated. The key
is the run's base key; each step folds in the step number, so masks and dropout are a function of
(seed, step, example index) only, and a restored run reproduces them exactly.

Metrics come back as on-device sums (loss_sum, correct_sum, num_predictions, ...) so the loop can
add them up without a host sync and divide once when it logs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
import ml_collections

from mlm_jax import masking, objectives, optim, sharding
from mlm_jax.model import Encoder


@struct.dataclass
class TrainState:
  step: jax.Array
  params: Any          # nnx.State of the encoder's Params (logical axis names in the metadata)
  opt_state: Any
  nonfinite: jax.Array  # number of updates skipped because the loss or a gradient was not finite


@dataclasses.dataclass
class Trainer:
  """Everything the loop needs, built once from the config: graph, optimizer, shardings, jitted steps."""
  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  graphdef: Any
  tx: optax.GradientTransformation
  schedule: Callable
  state_sharding: Any
  batch_sharding: jax.sharding.NamedSharding
  init: Callable         # () -> TrainState, created directly in its sharded layout
  train_step: Callable   # (state, batch, key) -> (state, metric sums)
  eval_step: Callable    # (params, batch, key) -> metric sums


def abstract_model(model_cfg: ml_collections.ConfigDict):
  """The encoder's graph and parameter shapes, without allocating anything."""
  model = nnx.eval_shape(lambda: Encoder(model_cfg))
  return nnx.split(model, nnx.Param)


def _forward_sums(graphdef, params, batch, dropout_key, activation_sharding=None):
  """Summed loss and metric sums over the batch's prediction slots."""
  model = nnx.merge(graphdef, params)
  hidden = model(batch["input_ids"], batch["segment_ids"], batch["positions"], batch.get("token_type_ids"),
                 dropout_key=dropout_key, activation_sharding=activation_sharding)
  y = model.mlm_transform(objectives.gather_slots(hidden, batch["masked_positions"]))
  sums = objectives.mlm_sums(y, model.word_embeddings[...], model.decoder_bias[...], batch["masked_labels"],
                             batch["masked_weights"])
  return sums["loss_sum"], sums


def _microbatches(batch, n):
  return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)


def apply_if_finite(state: TrainState, grads, tx: optax.GradientTransformation, finite,
                    platform: str = "cpu") -> TrainState:
  """One optimizer update; a non-finite step leaves params and optimizer untouched (and is counted).

  On CPU a lax.cond, whose skipped branch costs nothing, where a select reads old and new values of
  every parameter and moment (~3% of a mini BERT CPU step). On accelerators the select fuses into
  the update and is free, while the cond cost ~6% in XLA's TPU cost model: `platform` is that of the
  mesh the step runs on (not the host's: the AOT tool compiles TPU programs on a CPU host).
  """
  def update(_):
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), new_opt

  if platform == "cpu":
    params, opt_state = jax.lax.cond(finite, update, lambda _: (state.params, state.opt_state), None)
  else:
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_params, new_opt = update(None)
    params, opt_state = keep(new_params, state.params), keep(new_opt, state.opt_state)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                    nonfinite=state.nonfinite + (~finite).astype(jnp.int32))


def make_trainer(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None) -> Trainer:
  mcfg, kcfg, ocfg = config.model, config.masking, config.optimizer
  masking.check_config(kcfg, mcfg.vocab_size)
  mesh = mesh if mesh is not None else sharding.make_mesh(config.mesh)
  rules = config.sharding.rules
  accum = int(ocfg.grad_accum_steps)
  if accum < 1 or config.train.batch_size % accum:
    raise ValueError(f"optimizer.grad_accum_steps={accum} must be >= 1 and divide "
                     f"train.batch_size={config.train.batch_size}")
  total_steps = int(config.train.steps)
  tx = optim.make_optimizer(ocfg, total_steps)
  schedule = optim.make_schedule(ocfg, total_steps)
  graphdef, abstract_params = abstract_model(mcfg)

  def init_fn():
    params = nnx.state(Encoder(mcfg, seed=config.seed), nnx.Param)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      nonfinite=jnp.zeros((), jnp.int32))

  abstract_state = jax.eval_shape(init_fn)
  state_sh = sharding.state_shardings(abstract_state, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh)   # also pins [batch, seq, hidden] activations (see model.py)
  repl = sharding.replicated(mesh)
  vocab = mcfg.vocab_size

  def train_step(state: TrainState, batch, key):
    step_key = jax.random.fold_in(key, state.step)
    mask_key, dropout_key = jax.random.split(step_key)
    batch = masking.mask_batch(batch, mask_key, kcfg, vocab)
    grad_fn = jax.grad(lambda p, b, k: _forward_sums(graphdef, p, b, k, batch_sh), has_aux=True)
    if accum == 1:
      grads, sums = grad_fn(state.params, batch, dropout_key)
    else:
      def body(carry, xs):
        micro, i = xs
        g, s = grad_fn(state.params, micro, jax.random.fold_in(dropout_key, i))
        return jax.tree.map(jnp.add, carry, (g, s)), None
      zeros = jax.tree.map(jnp.zeros_like, (state.params, _sums_like()))
      (grads, sums), _ = jax.lax.scan(body, zeros, (_microbatches(batch, accum), jnp.arange(accum)))
    # Gradient of the mean loss over all predictions of the global batch, however it was split.
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["num_predictions"], 1.0), grads)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)
    new_state = apply_if_finite(state, grads, tx, finite, sharding.platform(mesh))
    metrics = dict(sums, grad_norm=grad_norm, learning_rate=schedule(state.step),
                   finite=finite.astype(jnp.float32))
    return new_state, metrics

  def eval_step(params, batch, key):
    batch = masking.mask_batch(batch, key, kcfg, vocab)
    _, sums = _forward_sums(graphdef, params, batch, None, batch_sh)
    return sums

  init = jax.jit(init_fn, out_shardings=state_sh)
  train_jit = jax.jit(train_step, donate_argnums=(0,), in_shardings=(state_sh, batch_sh, repl),
                      out_shardings=(state_sh, repl))
  eval_jit = jax.jit(eval_step, in_shardings=(state_sh.params, batch_sh, repl), out_shardings=repl)
  return Trainer(config=config, mesh=mesh, graphdef=graphdef, tx=tx, schedule=schedule,
                 state_sharding=state_sh, batch_sharding=batch_sh, init=init, train_step=train_jit,
                 eval_step=eval_jit)


def _sums_like():
  z = jnp.zeros((), jnp.float32)
  return dict(loss_sum=z, correct_sum=z, num_predictions=z)


def model_from_params(graphdef, params) -> Encoder:
  """An Encoder module holding `params` (for inference, conversion and tools)."""
  return nnx.merge(graphdef, params)
