"""The one place that makes a run's input (config + the objective's input kind -> batch iterator), and
`LoopInput`, the iterator as the training loop reads it.

`data.sources` picks the path (store:DIR or streaming text); only that path's modules are imported.
Which iterator serves which input kind: docs/design_notes.md#inputs.
"""
from __future__ import annotations

from mlm_jax.data import specs
from mlm_jax.errors import DataError

# input kind -> the sentence-pair task it reads (None: packed rows of documents)
INPUT_KINDS = {"rows": None, "nsp_pairs": "nsp", "sop_pairs": "sop"}


def make_input(config, input_kind: str, tokenizer, split: str = "train", *, process_index: int = 0,
               process_count: int = 1, workdir: str = "", rows_before: int = 0):
  """This process's rows of each global batch of `config.train.batch_size` rows.

  A token store (`store:DIR` sources) gives every process exactly its rows of global batches that
  do not depend on the process count; its packing index is cached in WORKDIR/data_index (a local
  temporary folder of the user's own for a gs:// workdir, or without one). Streaming text: data.per_host='shard' (default) has each process
  read its own disjoint part of the corpus (scales to any corpus and host count); 'slice' has each
  read the whole stream and keep its rows, so the global batches are identical for any process
  count (small corpora, reproducibility tests).

  Args:
    config: the run's config (reads `data`, `train.batch_size`, `seed`).
    input_kind: one of INPUT_KINDS, from the objective.
    tokenizer: the run's Tokenizer (the streaming path tokenizes with it; a store carries its own).
    split: 'train' or 'eval'.
    rows_before: global rows of the same order that earlier phases of the run read: the input continues
      after them (training/phase_runner.py decides when a phase continues the order).
  """
  if input_kind not in INPUT_KINDS:
    raise DataError(f"input kind {input_kind!r}: expected one of {sorted(INPUT_KINDS)}")
  local = config.train.batch_size // process_count
  task = INPUT_KINDS[input_kind]
  if task is not None or specs.is_store(config.data):
    from mlm_jax.data.store import index as store_index, loader, pairs   # only here: a text run never imports the store package
    cache_dir = store_index.cache_dir_for(workdir) if workdir else None
    if task is not None:
      pipeline = pairs.PairPipeline(config.data, task, local, config.seed, process_index, process_count, split,
                                    cache_dir=cache_dir)
    else:
      pipeline = loader.StorePipeline(config.data, local, config.seed, process_index, process_count, split,
                                      cache_dir=cache_dir)
    pipeline.continue_after(rows_before)
    return pipeline
  from mlm_jax.data.text import stream
  if config.data.per_host == "slice":
    whole = stream.Pipeline(config.data, tokenizer, config.train.batch_size, seed=config.seed, split=split,
                            rows_before=rows_before)
    return RowSlice(whole, process_index * local, local)
  if rows_before % process_count:
    raise DataError(f"{rows_before} rows before this phase cannot be split over {process_count} processes")
  return stream.Pipeline(config.data, tokenizer, local, seed=config.seed, process_index=process_index,
                         process_count=process_count, split=split, rows_before=rows_before // process_count)


def eval_parts(config) -> dict:
  """{name: a copy of `config` whose eval split is that source's alone}, for held-out metrics per source
  (per language, when sources are named by language): with two or more sources in the eval split. Text:
  data.eval_sources, else data.sources (their eval_percent held out); a token store: every source of every
  store entry that has held-out documents, named as the store input names them ('en', or 'label/en')."""
  import ml_collections
  c = config.data
  if specs.is_store(c):
    from mlm_jax.data.store import shards   # only here: a text run never imports the store package
    parts = {}
    for entry in c.sources:
      label, spec = specs.split_named(entry)
      root, names = shards.parse_store_spec(spec)
      store = shards.Store(root)
      names = names or sorted(store.sources)
      for name in names:
        if int(store.source(name).get("eval_tokens", 0)) > 0:
          full = (label if len(names) == 1 else f"{label}/{name}") if label else name
          parts[full] = dict(sources=(f"{label + '=' if label else ''}store:{root}:{name}",))
  else:
    field = "eval_sources" if c.eval_sources else "sources"
    if field == "sources" and not c.eval_percent > 0:
      return {}
    parts = {n.name: {field: (entry,)} for n, entry in zip(specs.parse_named(c[field]), c[field])}
  if len(parts) < 2:
    return {}
  out = {}
  for name, data in parts.items():
    copy = ml_collections.ConfigDict(config.to_dict())
    copy.data.update(data)
    out[name] = copy
  return out


class RowSlice:
  """Every process reads the whole global batch and keeps its rows (data.per_host='slice')."""

  def __init__(self, pipeline, start: int, size: int):
    self.pipeline, self.start, self.size = pipeline, start, size

  def __iter__(self):
    return self

  def __next__(self):
    return {k: v[self.start:self.start + self.size] for k, v in next(self.pipeline).items()}

  def rewind(self):
    self.pipeline.rewind()

  def get_state(self):
    return self.pipeline.get_state()

  def set_state(self, state):
    self.pipeline.set_state(state)

  def adopted_config(self) -> dict:
    return self.pipeline.adopted_config()

  def resume_facts(self) -> dict:
    return self.pipeline.resume_facts()


class LoopInput:
  """A batch iterator as the training loop's Input: the stream is sequential, so `step` only names
  the batch; the iterator's state is the position saved with each checkpoint."""

  def __init__(self, pipeline):
    self.pipeline = pipeline

  def batch(self, step: int) -> dict:
    return next(self.pipeline)

  def metrics(self) -> dict:
    """A token store's per-source epochs, tokens and current weight (global), its mixing phase and
    alpha under a curriculum, and a pair stream's counts, for the log line."""
    stats = self.pipeline.stats() if hasattr(self.pipeline, "stats") else {}
    out = {f"data/{name}/{k}": float(s[k]) for name, s in stats.get("sources", {}).items()
           for k in ("epochs", "tokens", "weight") if k in s}
    out.update({f"data/{k}": float(v) for k, v in stats.items() if k in ("mix_alpha", "phase")})
    out.update({f"data/{k}": float(v) for k, v in stats.get("pairs", {}).items()})
    return out

  def get_state(self) -> dict:
    return self.pipeline.get_state()

  def set_state(self, state: dict) -> None:
    self.pipeline.set_state(state)

  def adopted_config(self) -> dict:
    """Config fields the resumed input took from its checkpoint (config.json records them)."""
    return getattr(self.pipeline, "adopted_config", dict)()

  def resume_facts(self) -> dict:
    """What workdir/migrate.data_state needs of this input to bring an earlier data state to today's form."""
    return getattr(self.pipeline, "resume_facts", dict)()
