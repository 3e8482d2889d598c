"""Source specs: the strings that name a corpus in `data.sources` (`name=spec`), parsed.

Text globs, `tsv:FIELD:GLOB`, `jsonl:FIELD:GLOB`, `tfds:NAME[/CONFIG]:SPLIT[:FEATURE]`, `tfrecord:GLOB`
(`store:DIR`: store/loader.py),
read by both input paths and mixed with `mixing_weights`. No TensorFlow at import but in `list_files` (gs://).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from mlm_jax.errors import DataError

# blank_line blocks are cut at the first line batch where they reach ~32k characters: far more
# than any seq_len of tokens, and it bounds the memory of a file that has no blank lines.
MAX_BLOCK_CHARS = 1 << 15
# The kinds read as lines of text (the rest are TFDS and pre-tokenized TFRecords).
TEXT_KINDS = ("text", "tsv", "jsonl")


@dataclasses.dataclass(frozen=True)
class Spec:
  kind: str      # text | tsv | jsonl | tfds | tfrecord
  pattern: str   # globs (comma separated), or NAME[/CONFIG] for tfds
  arg: str = ""  # tsv: field index; jsonl: field name; tfds: SPLIT:FEATURE


def split_named(item: str):
  """'name=spec' -> (name, spec); a bare spec -> ('', spec)."""
  m = re.match(r"^([A-Za-z0-9_.\-]+)=(.+)$", item.strip())
  return (m.group(1), m.group(2)) if m else ("", item.strip())


def parse_spec(spec: str) -> Spec:
  if spec.startswith("tfds:"):
    parts = spec[len("tfds:"):].split(":")
    if len(parts) not in (2, 3) or not all(parts):
      raise DataError(f"bad TFDS spec {spec!r}: expected tfds:NAME[/CONFIG]:SPLIT[:FEATURE]")
    return Spec("tfds", parts[0], ":".join([parts[1], parts[2] if len(parts) == 3 else "text"]))
  if spec.startswith("tfrecord:"):
    return Spec("tfrecord", spec[len("tfrecord:"):])
  if spec.startswith("tsv:"):
    m = re.match(r"^tsv:(\d+):(.+)$", spec)
    if not m:
      raise DataError(f"bad TSV spec {spec!r}: expected tsv:FIELD:GLOB")
    return Spec("tsv", m.group(2), m.group(1))
  if spec.startswith("jsonl:"):
    m = re.match(r"^jsonl:([^:/*?\[\]]+):(.+)$", spec)
    if not m:
      raise DataError(f"bad JSON-lines spec {spec!r}: expected jsonl:FIELD:GLOB (FIELD: a top-level key, "
                      "e.g. jsonl:text:GLOB)")
    return Spec("jsonl", m.group(2), m.group(1))
  if spec.startswith("text:"):
    spec = spec[len("text:"):]
  if not spec:
    raise DataError("empty source spec")
  return Spec("text", spec)


@dataclasses.dataclass
class NamedSpec:
  """One entry of `data.sources`: its name (labels logs and mixing weights) and parsed spec."""
  name: str
  spec_str: str
  spec: Spec

  @property
  def owner(self) -> str:
    """How errors name the source: the entry as the user wrote it."""
    return f"{self.name}={self.spec_str}" if self.name else self.spec_str


def text_field(kind: str, arg: str):
  """What the line readers take from a line of a text-kind source: -1 (all of it), a TSV column
  (int) or a JSON key (str)."""
  return int(arg) if kind == "tsv" else arg if kind == "jsonl" else -1


def parse_named(entries: Sequence[str]) -> list:
  """`('en=corpus/en/*.gz', 'tfds:wiki40b/en:train', ...)` -> [NamedSpec]; names default to sourceI."""
  if isinstance(entries, str):
    entries = (entries,)
  out, seen = [], set()
  for i, item in enumerate(entries):
    name, spec = split_named(item)
    name = name or f"source{i}"
    if name in seen:
      raise DataError(f"duplicate source name {name!r} in {list(entries)}")
    seen.add(name)
    out.append(NamedSpec(name=name, spec_str=spec, spec=parse_spec(spec)))
  return out


def mixing_weights(sizes: Sequence[float], alpha: float) -> list:
  """p_i = n_i^alpha / sum_j n_j^alpha (XLM-R, Conneau et al. 2020, eq. 1): both paths mix so."""
  w = [float(n) ** alpha if n > 0 else 0.0 for n in sizes]
  total = sum(w)
  if total <= 0:
    raise DataError(f"all source sizes are zero: {list(sizes)}")
  return [x / total for x in w]


def list_files(pattern: str, owner: str = "") -> list:
  """Sorted files matching the comma-separated globs; a glob matching nothing is an error.

  tf.io.gfile lists local and remote (gs://) paths alike; TensorFlow is imported here, on first
  use, with every GPU hidden from it.
  """
  from mlm_jax import runtime
  tf = runtime.tensorflow()
  files = []
  owner = "" if owner == pattern else owner
  for glob in pattern.split(","):
    glob = glob.strip()
    try:
      matched = tf.io.gfile.glob(glob)
    except tf.errors.OpError as e:
      raise DataError(f"cannot list {glob!r}{of_source(owner)}: {first_line(e.message)}") from None
    if not matched:
      raise DataError(f"no files match {glob!r}{of_source(owner)}")
    files.extend(matched)
  return sorted(set(files))


def of_source(owner: str) -> str:
  """' (source OWNER)', the suffix errors name a source with; '' without one."""
  return f" (source {owner})" if owner else ""


def first_line(s) -> str:
  return str(s).strip().splitlines()[0] if str(s).strip() else ""


def is_store(data_config) -> bool:
  """Whether data.sources are token stores (`store:DIR`); they cannot be mixed with text sources."""
  kinds = [split_named(s)[1].startswith("store:") for s in data_config.sources]
  if any(kinds) and not all(kinds):
    raise DataError(f"data.sources mixes token stores and text sources {list(data_config.sources)}:"
                    " prepare the text sources into a store too")
  return bool(kinds) and all(kinds)
