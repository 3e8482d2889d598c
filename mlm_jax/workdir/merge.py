"""Checkpoint merging: the (weighted) mean of the parameters of several checkpoints of one architecture
and tokenizer (the last K of a run, given steps, or the branches of one), written as a workdir that
to_hf, init_from, mlm_jax.downstream and fill-mask read like a trained one. docs/phases.md#merging.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from mlm_jax import paths
from mlm_jax.errors import CheckpointError
from mlm_jax.workdir import checkpoints, files, restore

# How to run a model, not what it is: merged models may differ in these.
_RUN_FIELDS = ("dtype", "param_dtype", "attention_impl", "hidden_dropout", "attention_dropout", "remat", "matmul")


def select(workdir: str, last: int = 0, steps: tuple = ()) -> list[tuple[str, int]]:
  """(workdir, step) of the given steps, the last `last` checkpoints, or the latest one."""
  have = checkpoints.steps_of(workdir)
  if not have:
    raise CheckpointError(f"{workdir}: no checkpoint")
  for s in steps:
    if s not in have:
      raise CheckpointError(f"{workdir}: no checkpoint for step {s} (have {', '.join(map(str, have))})")
  if steps:
    return [(workdir, int(s)) for s in steps]
  if last > len(have):
    raise CheckpointError(f"{workdir}: --last={last} but only {len(have)} checkpoints ({', '.join(map(str, have))})")
  return [(workdir, s) for s in have[-max(last, 1):]]


def _tokenizer_sha(workdir: str, config) -> str:
  from mlm_jax.data.tokenizers import load as tokenizer_load
  path = files.tokenizer_path(workdir, config)
  return tokenizer_load.sha256_of(path) if not paths.missing(path) else ""


def check_same(configs: list, workdirs: list) -> None:
  """One line naming the first model field or the tokenizer in which a source differs from the first."""
  first = configs[0]
  for wd, c in zip(workdirs[1:], configs[1:]):
    if c.get("objective") != first.get("objective"):
      raise CheckpointError(f"cannot merge {wd} with {workdirs[0]}: objective {c.get('objective')!r} vs "
                            f"{first.get('objective')!r}")
    for key in sorted(set(first.model) | set(c.model)):
      if key not in _RUN_FIELDS and first.model.get(key) != c.model.get(key):
        raise CheckpointError(f"cannot merge {wd} with {workdirs[0]}: model.{key}={c.model.get(key)!r} vs "
                              f"{first.model.get(key)!r} (another architecture, or a phase with other model settings)")
    if _tokenizer_sha(wd, c) != _tokenizer_sha(workdirs[0], first):
      raise CheckpointError(f"cannot merge {wd} with {workdirs[0]}: another tokenizer "
                            f"({files.tokenizer_path(wd, c)} vs {files.tokenizer_path(workdirs[0], first)})")


def _params(workdir: str, config, step: int):
  return restore.restore_objective(workdir, config, step)[1]


def mean_params(trees: list, weights: list[float]):
  """The weighted mean of parameter trees, leaf by leaf in float64, in each leaf's dtype."""
  w = np.asarray(weights, np.float64) / float(np.sum(weights))
  def mean(*leaves):
    acc = sum(wi * np.asarray(x, np.float64) for wi, x in zip(w, leaves))
    return jnp.asarray(acc.astype(np.asarray(leaves[0]).dtype))
  return jax.tree.map(mean, *trees)


def merge(sources: list[tuple[str, int]], out: str, weights: list[float] | None = None) -> dict:
  """Write the mean of `sources` ((workdir, step) pairs) into workdir `out`; returns a summary."""
  if not sources:
    raise CheckpointError("nothing to merge: give checkpoints")
  weights = list(weights) if weights else [1.0] * len(sources)
  if len(weights) != len(sources) or min(weights) < 0 or sum(weights) <= 0:
    raise CheckpointError(f"--weights={weights}: expected {len(sources)} non-negative weights, not all 0")
  out = paths.absolute(out)
  if os.path.exists(os.path.join(out, "checkpoints")):
    raise CheckpointError(f"{out}: already holds checkpoints; merge into a new folder")
  workdirs = [paths.absolute(w) for w, _ in sources]
  configs = [files.config_at(w, s) for w, (_, s) in zip(workdirs, sources)]   # a phase's own (its RoPE theta)
  check_same(configs, workdirs)
  merged = mean_params([_params(w, c, s) for (w, s), c in zip(sources, configs)], weights)
  config = configs[-1]   # the newest source's phase
  config.data.tokenizer = files.tokenizer_path(workdirs[-1], config)
  config.phases = ()   # one model, one config: no phase to look up for its step
  step = max(s for _, s in sources)
  record = dict(merged_from=[f"{w}:{s}" for w, s in zip(workdirs, (s for _, s in sources))], weights=weights)
  os.makedirs(out, exist_ok=True)
  ckpt = checkpoints.Checkpointer(out, keep=1, async_save=False)
  ckpt.save(step, {"params": merged, "step": jnp.asarray(step, jnp.int32)}, record)
  ckpt.close()
  files.write_config(config, out)
  with open(os.path.join(out, "merge.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2)
  return dict(out=out, step=step, **record)
