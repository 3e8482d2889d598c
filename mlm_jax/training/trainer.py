"""The pure train and eval steps: the objective's prepare (masking) -> its loss -> grads -> AdamW.

`train_step(state, batch, key, values) -> (state, metrics)` is one jax.jit with the state donated; each
step folds its number into the run's key, so masks and dropout depend on (seed, step, example) only.
Metrics are on-device sums, added up by the loop without a host sync. `values` (config/step_values.py:
RoPE theta, the mask rate) is an argument of the jitted steps, handed on to the objective's calls;
`Trainer.values` holds the config's, and a phase that differs only in them runs the same compiled steps
with its own (training/phase_runner.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
import ml_collections

from mlm_jax.config.step_values import StepValues
from mlm_jax.training import optim
from mlm_jax.model import sharding
from mlm_jax.objectives.interface import Description, Step


@struct.dataclass
class TrainState:
  step: jax.Array
  params: Any          # nnx.State of the encoder's Params (logical axis names in the metadata)
  opt_state: Any
  nonfinite: jax.Array  # number of updates skipped because the loss or a gradient was not finite
  ema: Any = None       # train.ema_decay > 0: the moving average of params (sharded like them); None = off


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
  train_step: Callable   # (state, batch, key, values) -> (state, metric sums)
  eval_step: Callable    # (params, batch, key, values) -> the objective's eval output (MLM: metric sums)
  objective: Step       # the objective's step (interface.Step), or fine-tuning's heads.TaskObjective
  description: type[Description] | None   # the pretraining objective's description; None for fine-tuning
  values: StepValues     # the config's step values, what the loop passes to the steps


def _microbatches(batch, n):
  """[B, ...] -> [n, B/n, ...], microbatch i = rows i, i + n, i + 2n, ...: each device's rows of the
  batch split evenly over the microbatches, so every microbatch stays on all devices (contiguous
  blocks put each on 1/n of them, and the step re-laid them out with all-gathers and permutes)."""
  return jax.tree.map(lambda x: jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1), batch)


def apply_if_finite(state: TrainState, grads, tx: optax.GradientTransformation, finite,
                    platform: str = "cpu") -> TrainState:
  """One optimizer update; a non-finite step leaves params and the optimizer's moments untouched (and is
  counted), but its counters (optax's integer leaves: the schedule's and Adam's step counts) advance
  with `state.step`, so the learning rate applied stays the one logged for each step.

  On CPU a lax.cond, whose skipped branch costs nothing; on accelerators a select, which fuses into the
  update (docs/design_notes.md#trainer). `platform` is that of the mesh the step runs on (not the
  host's: the AOT tool compiles TPU programs on a CPU host).
  """
  def update(_):
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), new_opt

  def counted(new_opt, old_opt):   # the new counters, the old everything else
    return jax.tree.map(lambda n, o: n if jnp.issubdtype(n.dtype, jnp.integer) else o, new_opt, old_opt)

  if platform == "cpu":
    params, opt_state = jax.lax.cond(finite, update, lambda _: (state.params, counted(update(None)[1], state.opt_state)),
                                     None)
  else:
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_params, new_opt = update(None)
    params, opt_state = keep(new_params, state.params), counted(new_opt, keep(new_opt, state.opt_state))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                    nonfinite=state.nonfinite + (~finite).astype(jnp.int32))


def make_trainer(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                 description: type[Description] | None = None, *, step: Step | None = None,
                 make_model: Callable[[], nnx.Module] | None = None, schedule: Callable | None = None) -> Trainer:
  """Init, shardings and the jitted steps for a pretraining objective's description (`Resolved.objective`:
  its step is made from `config`, and its model), or for fine-tuning's `step` (heads.TaskObjective) and
  `make_model` (its task model). `schedule`: the learning rate by step, for a run in phases (one schedule
  over all of them)."""
  objective = step if step is not None else description.step(config)
  make_model = make_model or (lambda: description.make_model(config))
  accum = int(config.optimizer.grad_accum_steps)
  ema_decay = float(config.train.get("ema_decay", 0.0))
  total_steps = int(config.train.steps)
  schedule = schedule or optim.make_schedule(config.optimizer, total_steps)
  tx = optim.make_optimizer(config.optimizer, total_steps, schedule)
  graphdef, _ = nnx.split(nnx.eval_shape(make_model), nnx.Param)

  def init_fn():
    params = nnx.state(make_model(), nnx.Param)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      nonfinite=jnp.zeros((), jnp.int32), ema=jax.tree.map(jnp.copy, params) if ema_decay else None)

  abstract_state = jax.eval_shape(init_fn)
  state_sh = sharding.state_shardings(abstract_state, mesh, config.sharding.rules)
  batch_sh = sharding.batch_sharding(mesh)   # also pins [batch, seq, hidden] activations (see model/encoder.py)
  repl = sharding.replicated(mesh)

  def loss_sums(params, batch, dropout_key, values):
    return objective.loss_sums(nnx.merge(graphdef, params), batch, dropout_key, batch_sh, values)

  def train_step(state: TrainState, batch, key, values: StepValues):
    step_key = jax.random.fold_in(key, state.step)
    prepare_key, dropout_key = jax.random.split(step_key)
    real_tokens = jnp.sum(batch["segment_ids"] > 0, dtype=jnp.float32)   # not padding (loop: real tok/s, MFU)
    batch = objective.prepare(batch, prepare_key, state.step, values)
    grad_fn = jax.grad(loss_sums, has_aux=True)
    if accum == 1:
      grads, sums = grad_fn(state.params, batch, dropout_key, values)
    else:
      def body(carry, xs):
        micro, i = xs
        g, s = grad_fn(state.params, micro, jax.random.fold_in(dropout_key, i), values)
        return jax.tree.map(jnp.add, carry, (g, s)), None
      first = jax.tree.map(lambda x: x[0], _microbatches(batch, accum))
      zeros = jax.tree.map(jnp.zeros_like, (state.params, jax.eval_shape(grad_fn, state.params, first,
                                                                         dropout_key, values)[1]))
      (grads, sums), _ = jax.lax.scan(body, zeros, (_microbatches(batch, accum), jnp.arange(accum)))
    # Gradient of the mean loss over the whole global batch, however it was split.
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums[objective.count_key], 1.0), grads)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)
    new_state = apply_if_finite(state, grads, tx, finite, sharding.platform(mesh))
    if ema_decay:   # a skipped step leaves the average as it was
      new_state = new_state.replace(ema=jax.tree.map(
          lambda e, p: jnp.where(finite, ema_decay * e + (1.0 - ema_decay) * p, e), state.ema, new_state.params))
    metrics = dict(sums, real_tokens=real_tokens, grad_norm=grad_norm, learning_rate=schedule(state.step),
                   finite=finite.astype(jnp.float32))
    return new_state, metrics

  def eval_step(params, batch, key, values: StepValues):
    return objective.evaluate(nnx.merge(graphdef, params), batch, key, batch_sh, values)

  init = jax.jit(init_fn, out_shardings=state_sh)
  train_jit = jax.jit(train_step, donate_argnums=(0,), in_shardings=(state_sh, batch_sh, repl, repl),
                      out_shardings=(state_sh, repl))
  eval_jit = jax.jit(eval_step, in_shardings=(state_sh.params, batch_sh, repl, repl), out_shardings=repl)
  return Trainer(config=config, mesh=mesh, graphdef=graphdef, tx=tx, schedule=schedule,
                 state_sharding=state_sh, batch_sharding=batch_sh, init=init, train_step=train_jit,
                 eval_step=eval_jit, objective=objective, description=description,
                 values=StepValues.of(config))   # numpy scalars, replicated by the jit (the AOT tool's mesh holds no data)


def fresh_or_init_from(trainer: Trainer) -> Callable[[], TrainState]:
  """The loop's state for a run without a checkpoint: initialized, with the parameters of the
  `init_from` source's encoder when the config names one (the optimizer and data start fresh)."""
  from absl import logging
  from mlm_jax.workdir import restore
  config = trainer.config

  def init_state() -> TrainState:
    state = trainer.init()
    if config.init_from:
      abstract = restore.abstract_with_shardings(jax.eval_shape(trainer.init), trainer.state_sharding)
      params = restore.restore_params_for(config.init_from, config.model, abstract.params, fresh=state.params)
      state = state.replace(params=params, ema=jax.tree.map(jnp.copy, params) if state.ema is not None else None)
      logging.info("initialized parameters from %s", config.init_from)
    return state

  return init_state
