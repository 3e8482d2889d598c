"""Linear probes of the frozen encoder during pretraining: is it learning features a task can use?

Every `train.probe_every` steps: a closed-form ridge classifier on a fixed sample of each
`train.probe_tasks` task, logged as `probe/<task>`, plus `probe/token_cosine` (near 1 = collapsed);
`blimp` among the tasks adds `probe/blimp`, the masked LM's zero-shot accuracy on a fixed BLiMP subset, and
`clams` adds `probe/clams/<lang>` per CLAMS language (and their mean, `probe/clams`) on a fixed sample.
Comparable across the steps of one run, not a fine-tuning estimate (docs/design_notes.md#probe).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from mlm_jax.model import sharding

HiddenFn = Callable[[dict], np.ndarray]   # a batch of task arrays -> [rows, seq, hidden] last-layer vectors

# The ridge penalty relative to the (unit) variance of each standardized feature. Fixed, because a
# probe's scores are compared across the steps of a run, not tuned per step.
RIDGE = 1e-2


@dataclasses.dataclass
class ProbeTask:
  """A task sample for probing: its arrays (tasks/features.py) and the scorer of its predictions."""
  name: str
  kind: str                                   # classification | token
  num_labels: int
  train: dict
  eval: dict
  score: Callable[[np.ndarray], float]        # [eval rows, labels] or [rows, seq, labels] scores -> metric


def fit_ridge(x: np.ndarray, y: np.ndarray, num_labels: int, ridge: float = RIDGE):
  """(mean, std, weights [d+1, labels]) of a ridge classifier of labels y [n] from features x [n, d]."""
  mean, std = x.mean(0), x.std(0) + 1e-6
  z = np.concatenate([(x - mean) / std, np.ones((len(x), 1), x.dtype)], axis=1).astype(np.float64)
  target = np.eye(num_labels)[y] - 1.0 / num_labels
  penalty = ridge * len(x) * np.eye(z.shape[1])
  penalty[-1, -1] = 0.0   # the intercept is not shrunk
  return mean, std, np.linalg.solve(z.T @ z + penalty, z.T @ target)


def predict_ridge(model, x: np.ndarray) -> np.ndarray:
  mean, std, w = model
  z = np.concatenate([(x - mean) / std, np.ones((len(x), 1), x.dtype)], axis=1)
  return z @ w


def pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Mean of each row's vectors where mask is set: [rows, seq, h], [rows, seq] -> [rows, h]."""
  m = mask.astype(hidden.dtype)[..., None]
  return (hidden * m).sum(1) / np.maximum(m.sum(1), 1.0)


def token_cosine(hidden: np.ndarray, mask: np.ndarray) -> float:
  """Mean over rows of the mean cosine between distinct real-token vectors of the row.

  For n unit vectors u_i, the sum over ordered pairs i != j of u_i.u_j is |sum u|^2 - n.
  """
  u = hidden / np.maximum(np.linalg.norm(hidden, axis=-1, keepdims=True), 1e-12)
  u = u * mask[..., None]
  n = mask.sum(1).astype(np.float64)
  keep = n >= 2
  if not keep.any():
    return float("nan")
  total = np.square(u.sum(1)).sum(-1) - n
  return float(np.mean(total[keep] / (n[keep] * (n[keep] - 1))))


def _hidden(hidden_fn: HiddenFn, arrays: dict, batch_size: int) -> np.ndarray:
  rows = len(arrays["input_ids"])
  out = []
  for i in range(0, rows, batch_size):
    part = {k: v[i:i + batch_size] for k, v in arrays.items()}
    n = len(part["input_ids"])
    if n < batch_size:   # a fixed batch shape: one compiled forward pass for every probe
      part = {k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)]) for k, v in part.items()}
    out.append(np.asarray(hidden_fn(part), np.float32)[:n])
  return np.concatenate(out)


def _examples(task: ProbeTask, arrays: dict, hidden: np.ndarray):
  """(features, labels) of a split: one per sentence, or one per labeled first piece."""
  if task.kind == "token":
    where = arrays["labels"] >= 0
    return hidden[where], arrays["labels"][where]
  return pooled(hidden, arrays["segment_ids"] > 0), arrays["label"]


def run_task(task: ProbeTask, hidden_fn: HiddenFn, batch_size: int) -> tuple[float, np.ndarray]:
  """(held-out score, the eval split's last-layer vectors) of one probe."""
  train_h = _hidden(hidden_fn, task.train, batch_size)
  eval_h = _hidden(hidden_fn, task.eval, batch_size)
  model = fit_ridge(*_examples(task, task.train, train_h), task.num_labels)
  if task.kind == "token":
    scores = predict_ridge(model, eval_h.reshape(-1, eval_h.shape[-1])).reshape(eval_h.shape[:2] + (-1,))
  else:
    scores = predict_ridge(model, pooled(eval_h, task.eval["segment_ids"] > 0))
  return float(task.score(scores)), eval_h


# Scored as: macro-F1 for sentences (accuracy flatters a probe on unbalanced classes: sms_spam is
# 87% ham), entity F1 for token tasks (token_accuracy for tags that are not IOB, e.g. POS).
DEFAULT_METRIC = dict(classification="macro_f1", token="f1")


def from_task_config(name: str, task_cfg, tok, seq_len: int, type_vocab_size: int,
                     max_train: int, max_eval: int, metric: str = "") -> ProbeTask:
  """A probe sample of a fine-tuning task (configs/finetune/*.py's `task` section): a fixed random
  `max_train` / `max_eval` examples (the fine-tuning reader's sample), scored by `metric`."""
  from mlm_jax.tasks import task as task_lib
  if task_cfg.kind not in ("classification", "token"):
    raise ValueError(f"probe task {name!r}: kind {task_cfg.kind!r} cannot be probed (classification or token)")
  cfg = task_cfg.copy_and_resolve_references()
  cfg.max_train_examples, cfg.max_eval_examples = int(max_train), int(max_eval)
  t = task_lib.build(cfg, tok, seq_len, type_vocab_size)
  metric = metric or (t.default_metric if t.kind == "token" else DEFAULT_METRIC[t.kind])
  return ProbeTask(name=name, kind=t.kind, num_labels=t.num_labels, train=t.train, eval=t.eval,
                   score=lambda scores: t.score(scores)[0][metric])


def from_suite(names, tok, seq_len: int, type_vocab_size: int, max_train: int, max_eval: int) -> list[ProbeTask]:
  """Probe samples of downstream suite tasks by name (mlm_jax/tasks/catalogue.py), read with their fast
  fine-tuning configs and scored by the suite's metric, at most `seq_len` tokens a row."""
  from mlm_jax.errors import ConfigError
  from mlm_jax.tasks import catalogue
  out = []
  for name in names:
    if name not in catalogue.BY_NAME:
      raise ConfigError(f"train.probe_tasks: unknown task {name!r} (expected some of "
                        f"{', '.join(catalogue.BY_NAME)}, {', '.join(PAIR_PROBES)})")
    task = catalogue.BY_NAME[name]
    cfg = catalogue.load_config(task, "fast", catalogue.data_dir())
    if cfg.task.kind not in DEFAULT_METRIC:
      raise ConfigError(f"train.probe_tasks: {name!r} is a {cfg.task.kind} task; a linear probe needs sentence "
                        f"or token classification ({', '.join(n for n in catalogue.BY_NAME if n != name)}...)")
    out.append(from_task_config(name, cfg.task, tok, min(int(cfg.seq_len), seq_len), type_vocab_size,
                                max_train, max_eval, metric=task.metric))
  return out


class Probes:
  """The loop's probe evaluator: (hidden_fn) -> {'probe/<task>': score, 'probe/token_cosine': c, ...}."""

  def __init__(self, tasks: list[ProbeTask], batch_size: int):
    if not tasks:
      raise ValueError("no probe tasks")
    self.tasks, self.batch_size = tasks, batch_size

  def __call__(self, hidden_fn: HiddenFn) -> dict:
    t0, out, cosines = time.perf_counter(), {}, []
    for task in self.tasks:
      out[f"probe/{task.name}"], eval_h = run_task(task, hidden_fn, self.batch_size)
      cosines.append(token_cosine(eval_h, task.eval["segment_ids"] > 0))
    out["probe/token_cosine"] = float(np.nanmean(cosines))
    out["probe/seconds"] = time.perf_counter() - t0
    return out


PAIR_PROBES = ("blimp", "clams")   # probe_tasks scored by the masked LM itself (PairsProbe)


class PairsProbe:
  """Zero-shot minimal pairs of the objective's masked LM by PLL (ties wrong), its rows split over the run's
  mesh, one Scorer (one compile) for all: `probe/blimp` on the first `probe_blimp_pairs` pairs of every
  paradigm; `probe/clams/<lang>` and their mean `probe/clams` on a fixed sample of `probe_clams_pairs` pairs
  a language (tasks/clams.py `sample`)."""

  def __init__(self, trainer, tok, names, train_config):
    from mlm_jax.errors import ConfigError
    from mlm_jax.evaluation import pll
    from mlm_jax.tasks import blimp, catalogue, clams
    t = train_config
    path, model_cfg = trainer.description.masked_lm(trainer.config)
    pll.check_mlm_head(model_cfg, f"train.probe_tasks={','.join(names)}")
    self.sets = {}
    if "blimp" in names:
      if t.probe_blimp_pairs < 1:
        raise ConfigError(f"train.probe_blimp_pairs={t.probe_blimp_pairs}: expected at least 1 pair per paradigm")
      self.sets["blimp"] = blimp.read(blimp.folder(catalogue.data_dir(need=blimp.FOLDER)), int(t.probe_blimp_pairs))
    if "clams" in names:
      if t.probe_clams_pairs < 1:
        raise ConfigError(f"train.probe_clams_pairs={t.probe_clams_pairs}: expected at least 1 pair per language")
      self.sets["clams"] = clams.sample(clams.folder(catalogue.data_dir(need=clams.FOLDER)),
                                        int(t.probe_clams_pairs), tuple(t.probe_clams_languages))
    self.scorer = pll.Scorer(trainer.graphdef, tok, pll.ROW_LEN, rows=Probe.ROWS, path=path, mesh=trainer.mesh,
                             max_len=pll.max_len(model_cfg), shift=trainer.description.prediction_shift)

  def __call__(self, params) -> dict:
    from mlm_jax.evaluation import zeroshot
    out = {}
    for name, sets in self.sets.items():
      r = zeroshot.score_pairs(self.scorer, params, sets)
      out[f"probe/{name}"] = r["overall"]
      out.update({f"probe/{name}/{group}": acc for group, acc in r.get("groups", {}).items()})
      out[f"probe/{name}_seconds"] = r["seconds"]
    return out


class Probe:
  """The training loop's probe: the objective's encoder run without dropout on fixed samples of
  `train.probe_tasks`, replicated on every device (a probe batch is small), linear classifiers fit
  on the host; `blimp` and `clams` score the masked LM (PairsProbe). Its task samples are read at start, so
  a bad task name fails before training."""

  ROWS = 64   # a probe forward pass's batch: one compiled shape for every probe

  def __init__(self, trainer, tok):
    from flax import nnx
    config = trainer.config
    path, model_cfg = trainer.description.encoder(config)
    t = config.train
    suite_tasks = [n for n in t.probe_tasks if n not in PAIR_PROBES]
    self.probes = Probes(from_suite(suite_tasks, tok, config.data.seq_len, model_cfg.type_vocab_size,
                                    t.probe_train_examples, t.probe_eval_examples), self.ROWS) if suite_tasks else None
    pairs = [n for n in PAIR_PROBES if n in t.probe_tasks]
    self.pairs = PairsProbe(trainer, tok, pairs, t) if pairs else None
    self.replicated = sharding.replicated(trainer.mesh)

    def hidden(params, batch):
      model = nnx.merge(trainer.graphdef, params)
      encoder = getattr(model, path) if path else model
      return encoder(batch["input_ids"], batch["segment_ids"], batch["positions"], batch["token_type_ids"])

    self.hidden = jax.jit(hidden, out_shardings=self.replicated)

  def __call__(self, params, step: int) -> dict:
    def last_layer(batch):
      keys = ("input_ids", "segment_ids", "positions", "token_type_ids")
      placed = {k: jax.make_array_from_process_local_data(self.replicated, batch[k]) for k in keys}
      return np.asarray(self.hidden(params, placed).addressable_data(0))
    out = self.probes(last_layer) if self.probes is not None else {}
    if self.pairs is not None:
      out.update(self.pairs(params))
    return out
