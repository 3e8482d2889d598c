"""`config.phases`: one run as an ordered schedule of phases (pretrain -> extend -> decay).

A phase is a dict: `name`, where it ends (`end_step`, or `end_tokens` counted over the whole run, as
papers state them) and `"section.field": value` overrides of the fields in MUTABLE. Overrides add up:
phase k's config is the base config with the overrides of phases 0..k. Reference: docs/phases.md.
"""
from __future__ import annotations

import dataclasses
import math

import ml_collections

from mlm_jax.errors import ConfigError

# What a phase may change mid-run: shapes and values of the step, the input, the learning-rate segment.
# Everything else (the architecture, the tokenizer, the optimizer's state layout, cadences) is the run's.
MUTABLE = frozenset({
    "data.seq_len", "data.sources", "data.eval_sources", "data.mix_alpha", "data.source_sizes",
    "data.source_start_steps", "data.packing_window",
    "train.batch_size",
    "model.rope_theta", "model.rope_theta_local",
    "masking.mask_rate", "masking.mode", "masking.mask_rate_schedule", "masking.max_predictions",
    "optimizer.learning_rate", "optimizer.schedule", "optimizer.warmup_steps", "optimizer.end_lr_ratio",
    "optimizer.decay_fraction", "optimizer.decay_shape",
})
# Optimizer fields that make a phase's own learning-rate segment (phases without them follow the run's schedule).
LR_FIELDS = frozenset(k for k in MUTABLE if k.startswith("optimizer."))
_KEYS = ("name", "end_step", "end_tokens")
_RECORD_KEYS = ("start_step", "values")   # what `recorded` adds to a phase (config.json)


@dataclasses.dataclass(frozen=True)
class Phase:
  name: str
  index: int
  start: int           # first step (global)
  end: int             # the step after its last one (the next phase's start)
  overrides: dict      # this phase's own "section.field" -> value

  @property
  def own_schedule(self) -> bool:
    return any(k in LR_FIELDS for k in self.overrides)


def _entries(config) -> list[dict]:
  out = []
  for i, p in enumerate(config.get("phases", ()) or ()):
    p = p.to_dict() if isinstance(p, ml_collections.ConfigDict) else p
    if isinstance(p, (tuple, list)) and all(isinstance(kv, (tuple, list)) and len(kv) == 2 for kv in p):
      p = {k: v for k, v in p}   # the recorded form (config.json, frozen configs)
    if not isinstance(p, dict):
      raise ConfigError(f"phases[{i}]={p!r}: expected a dict with name, end_step or end_tokens, and overrides")
    out.append(dict(p))
  return out


def _value(v):
  return tuple(_value(x) for x in v) if isinstance(v, list) else v


def _overrides(config, i: int, entry: dict) -> dict:
  name, out = entry.get("name"), {}
  for key, value in entry.items():
    if key in _KEYS or key in _RECORD_KEYS:
      continue
    section, _, field = key.partition(".")
    if not field or section not in config or not isinstance(config[section], ml_collections.ConfigDict) \
        or field not in config[section]:
      raise ConfigError(f"phases[{i}] {name!r}: unknown field {key!r} (expected 'section.field', e.g. 'data.seq_len')")
    if key not in MUTABLE:
      raise ConfigError(f"phases[{i}] {name!r}: {key} cannot change mid-run (the parameters, the tokenizer or "
                        f"the optimizer state depend on it); a phase may set {', '.join(sorted(MUTABLE))}")
    out[key] = _value(value)
  return out


def apply(config: ml_collections.ConfigDict, overrides: dict) -> None:
  """Set each "section.field" of `overrides` in `config` (in place; the types are the config's)."""
  for key, value in overrides.items():
    section, field = key.split(".", 1)
    old = config[section][field]
    if isinstance(old, tuple):
      value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    elif isinstance(old, float) and isinstance(value, int):
      value = float(value)
    try:
      config[section][field] = value
    except TypeError as e:
      raise ConfigError(f"phases: {key}={value!r}: {e}") from None


def config_of(config: ml_collections.ConfigDict, phases: list[Phase], k: int) -> ml_collections.ConfigDict:
  """Phase k's config: `config` with the overrides of phases 0..k (a copy)."""
  out = ml_collections.ConfigDict(config.to_dict())
  for p in phases[:k + 1]:
    apply(out, p.overrides)
  return out


def parse(config: ml_collections.ConfigDict) -> list[Phase]:
  """The phases with their steps; [] for a run without. One ConfigError per bad phase, naming it."""
  entries, phases = _entries(config), []
  names, start, tokens = set(), 0, 0
  work = ml_collections.ConfigDict(config.to_dict())
  for i, entry in enumerate(entries):
    name = entry.get("name")
    if not isinstance(name, str) or not name or name in names:
      raise ConfigError(f"phases[{i}]: name={name!r}: expected a non-empty name of its own")
    names.add(name)
    overrides = _overrides(config, i, entry)
    apply(work, overrides)
    per_step = int(work.train.batch_size) * int(work.data.seq_len)
    given = [k for k in ("end_step", "end_tokens") if entry.get(k) is not None]
    if len(given) != 1:
      raise ConfigError(f"phases[{i}] {name!r}: give exactly one of end_step, end_tokens (got {given or 'neither'})")
    if given[0] == "end_step":
      end = int(entry["end_step"])
    else:   # tokens of the whole run up to this phase's end (slots: batch x seq_len per step)
      end = start + max(0, math.ceil((int(entry["end_tokens"]) - tokens) / per_step))
    if end <= start:
      raise ConfigError(f"phases[{i}] {name!r}: ends at step {end}, not after its start {start} (phase ends "
                        f"must increase: {given[0]}={entry[given[0]]})")
    phases.append(Phase(name, i, start, end, overrides))
    tokens += (end - start) * per_step
    start = end
  return phases


def each_phase(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
  """[(name, its config without phases)] of a run in phases, one per phase; [("", config)] otherwise
  (the AOT tool compiles each)."""
  phases = parse(config)
  if not phases:
    return [("", config)]
  out = []
  for p in phases:
    c = config_of(config, phases, p.index)
    c.phases = ()
    out.append((p.name, c))
  return out


def step_at_tokens(config: ml_collections.ConfigDict, phases: list[Phase], tokens: int) -> int:
  """The first step by which the run has trained `tokens` token slots (batch x seq_len per step)."""
  if not phases:
    return math.ceil(tokens / (int(config.train.batch_size) * int(config.data.seq_len)))
  done = 0
  for p in phases:
    c = config_of(config, phases, p.index)
    per_step = int(c.train.batch_size) * int(c.data.seq_len)
    if done + (p.end - p.start) * per_step >= tokens:
      return p.start + math.ceil((tokens - done) / per_step)
    done += (p.end - p.start) * per_step
  return phases[-1].end


def bind_token_lengths(config: ml_collections.ConfigDict, phases: list[Phase]) -> None:
  """optimizer.warmup_tokens / decay_tokens -> warmup_steps / decay_fraction of the run (in place)."""
  o = config.optimizer
  total = phases[-1].end if phases else int(config.train.steps)
  if int(o.get("warmup_tokens", 0)) > 0:
    o.warmup_steps = step_at_tokens(config, phases, int(o.warmup_tokens))
  if int(o.get("decay_tokens", 0)) > 0:
    start = step_at_tokens(config, phases, tokens_of(config, phases, total) - int(o.decay_tokens))
    o.decay_fraction = (total - start) / total


def tokens_of(config: ml_collections.ConfigDict, phases: list[Phase], steps: int) -> int:
  """Token slots of the run's first `steps` steps."""
  if not phases:
    return steps * int(config.train.batch_size) * int(config.data.seq_len)
  out = 0
  for p in phases:
    c = config_of(config, phases, p.index)
    out += max(0, min(steps, p.end) - p.start) * int(c.train.batch_size) * int(c.data.seq_len)
  return out


def index_at(phases: list[Phase], step: int) -> int:
  """The phase that trains step `step` (0-based: the step after `step` steps are done); the last after the end."""
  for p in phases:
    if step < p.end:
      return p.index
  return phases[-1].index


def recorded(phases: list[Phase], configs: list) -> tuple:
  """The phases as a resolved config (and config.json) records them: each a tuple of (key, value)
  pairs (a frozen config holds no dicts in tuples), with its start and end step, its own overrides and
  `values`: its value of every "section.field" that differs between the phases' resolved `configs`
  (derived ones too, e.g. the prediction slots). config.json's sections are the last phase's; with
  `values`, `at_step` rebuilds any phase's config from it."""
  differ = _differing_fields(configs)
  return tuple((("name", p.name), ("start_step", p.start), ("end_step", p.end), *p.overrides.items(),
                ("values", tuple((key, c[key.split(".")[0]][key.split(".")[1]]) for key in differ)))
               for p, c in zip(phases, configs))


def _differing_fields(configs: list) -> list[str]:
  first, out = configs[0], []
  for section, fields in first.items():
    if not isinstance(fields, ml_collections.ConfigDict):
      continue
    for field, value in fields.items():
      if not isinstance(value, ml_collections.ConfigDict) and any(c[section].get(field) != value for c in configs[1:]):
        out.append(f"{section}.{field}")
  return out


def at_step(config: ml_collections.ConfigDict, step: int) -> ml_collections.ConfigDict:
  """The config of the phase that trained checkpoint `step` (its last step, step - 1, is that phase's),
  from a config as config.json records it (the last phase's sections and the recorded phases); a run
  without phases: `config` itself."""
  entries = _entries(config)
  if not entries:
    return config
  k = next((i for i, e in enumerate(entries) if step <= int(e["end_step"])), len(entries) - 1)
  out = ml_collections.ConfigDict(config.to_dict())
  apply(out, {key: _value(v) for key, v in entries[k]["values"]})
  return out
