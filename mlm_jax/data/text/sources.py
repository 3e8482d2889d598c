"""Document sources: text files, TFDS datasets and TFRecords -> tf.data of documents, per host.

Hosts read disjoint parts that together are the whole corpus. Bad input is one DataError line naming
the file; invalid UTF-8, empty or truncated files and over-long lines are repaired and counted in
`Stats` (errors with `data.strict`). Spec syntax and repairs: docs/design_notes.md#sources.
"""
import dataclasses
import gzip
import logging
import re
import zlib
from typing import Optional, Sequence

import numpy as np

from mlm_jax.config import choices
from mlm_jax import errors, runtime
from mlm_jax.data import jsonl, specs
from mlm_jax.data.specs import MAX_BLOCK_CHARS, TEXT_KINDS, Spec, list_files
from mlm_jax.data.specs import first_line as _first_line, of_source as _of

tf = runtime.tensorflow()   # for tf.data only, off every GPU

_READ_BATCH = 256  # lines cleaned per vectorised op (per-line ops cost more than the work)
READ_BLOCK = 4096  # elements a tf.data batch hands Python at once (numpy_elements)


DataError = errors.DataError


def numpy_elements(ds, block: int = READ_BLOCK):
  """The elements of `ds` (a tf.data dataset of scalars) as numpy values, in order, for a Python loop.

  Read in blocks: tf.data hands Python one element in ~170-200 us, an element of a block in ~15 us, so a
  loop over lines or records runs ~10x faster (docs/tokenizers.md, docs/token_store.md#measured-speed).
  """
  for values in ds.batch(block).as_numpy_iterator():
    yield from values


def as_written(fn):
  """`fn` for a tf.data transformation (map, filter, scan, interleave), traced without autograph.

  The input path's functions are graph code already (tf ops, tf.cond / tf.while_loop; Python branches
  only on Python values), so autograph's rewrite of them only costs start-up time, at every run's
  start (docs/design_notes.md#tf_packing).
  """
  return tf.autograph.experimental.do_not_convert(fn)


class Stats:
  """Counters of repaired or skipped input, updated from inside tf.data (tf.Variables).

  Reported by the pipeline in its logs; never used to alter the data stream.
  """

  KEYS = ("empty_docs", "invalid_utf8_lines", "long_docs_split", "long_blocks_split",
          "long_lines_cut", "bad_json_records")
  BENIGN = ("empty_docs", "long_docs_split")  # how normal text looks: never refused

  def __init__(self, strict: bool = False, max_line_bytes: int = 1 << 16):
    self.strict = strict
    self.max_line_bytes = max_line_bytes
    self.empty_files = []
    self.truncated_files = []
    self._checked = set()
    self._vars = {k: tf.Variable(0, dtype=tf.int64, trainable=False) for k in self.KEYS}
    self._drawn = {}   # source name -> (rows, real tokens) drawn by this process's train stream, its weight

  def track_source(self, name: str, weight: float) -> None:
    """Counters of the rows and real tokens (BOS/EOS included) that `count_row` sees of a source."""
    if name not in self._drawn:   # a rebuilt dataset keeps its counters, and takes the new weight
      self._drawn[name] = [tf.Variable(0, dtype=tf.int64, trainable=False),
                           tf.Variable(0, dtype=tf.int64, trainable=False), None]
    self._drawn[name][2] = weight

  def count_row(self, name: str, row: dict) -> dict:
    """`row` (one packed row of source `name`), after adding it to its counters."""
    n_rows, n_tokens, _ = self._drawn[name]
    real = tf.math.count_nonzero(row["segment_ids"], dtype=tf.int64)
    with tf.control_dependencies([n_rows.assign_add(1), n_tokens.assign_add(real)]):
      return {k: tf.identity(v) for k, v in row.items()}

  def restart_drawn(self) -> None:
    """Zero the source counters (a new iterator draws the stream again from its first row)."""
    for rows, tokens, _ in self._drawn.values():
      rows.assign(0), tokens.assign(0)

  def drawn(self) -> dict:
    """Per tracked source: rows and real tokens drawn so far (`rows_local`, `tokens_local`), its weight."""
    return {name: dict(rows_local=int(r.numpy()), tokens_local=int(t.numpy()), weight=float(w))
            for name, (r, t, w) in self._drawn.items()}

  def add(self, key, n, where=""):
    """Counts `n` repairs of kind `key`; with strict, an op that fails when n > 0."""
    n = tf.cast(n, tf.int64)
    op = self._vars[key].assign_add(n)
    if self.strict and key not in self.BENIGN:
      check = tf.debugging.Assert(tf.equal(n, 0), [
          f"{_STRICT}: {key.replace('_', ' ')} in", where], summarize=1)
      return tf.group(op, check)
    return op

  def check_gzip(self, path) -> None:
    """Warns once per file (counts; with strict, raises) when a .gz stream ends early."""
    path = path.numpy().decode() if hasattr(path, "numpy") else path
    if not path.endswith(".gz") or path in self._checked:
      return
    self._checked.add(path)
    if gzip_complete(path):
      return
    if self.strict:
      raise DataError(f"{path} is truncated (gzip stream ends early); {_STRICT}")
    logging.warning("%s is truncated (gzip stream ends early): trained on its readable part", path)
    self.truncated_files.append(path)

  def as_dict(self) -> dict:
    d = {k: int(v.numpy()) for k, v in self._vars.items()}
    d["empty_files"] = len(self.empty_files)
    d["truncated_files"] = len(self.truncated_files)
    return d


_STRICT = "data.strict=True refuses repaired or skipped input"


def gzip_complete(path: str) -> bool:
  """Whether the file's last gzip member ends with its end-of-stream marker.

  Decompresses once, 4 MB of output at a time (memory stays bounded for any file): about
  as fast as reading the file, and done once per file and process.
  """
  d = zlib.decompressobj(wbits=31)
  with tf.io.gfile.GFile(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      while block:
        if d.eof:  # the next member of a multi-member file
          d = zlib.decompressobj(wbits=31)
        try:
          d.decompress(block, 1 << 22)
        except zlib.error:
          return False
        block = d.unused_data if d.eof else d.unconsumed_tail
  return d.eof


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------
def check_files(files: Sequence[str], owner: str, stats: Optional[Stats]) -> list:
  """Opens each file once, so unreadable ones fail here with their name, not deep in tf.data.

  Returns the non-empty files; empty ones are recorded in `stats.empty_files` and logged.
  """
  keep = []
  for path in files:
    if tf.io.gfile.isdir(path):
      raise DataError(f"cannot read {path}{_of(owner)}: is a directory")
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        if path.endswith(".gz"):
          with gzip.GzipFile(fileobj=f) as g:
            first = g.read(1)
        else:
          first = f.read(1)
    except (OSError, EOFError, tf.errors.OpError) as e:
      reason = e.message if isinstance(e, tf.errors.OpError) else f"{e.__class__.__name__}: {e}"
      raise DataError(f"cannot read {path}{_of(owner)}: {_first_line(reason)}") from None
    if not first:
      if stats is not None and stats.strict:
        raise DataError(f"{path}{_of(owner)} is empty; {_STRICT}")
      logging.warning("skipping empty file %s%s", path, _of(owner))
      if stats is not None:
        stats.empty_files.append(path)
      continue
    keep.append(path)
  return keep


def _clean_lines(lines, field, stats: Optional[Stats], path=""):
  """Batch of raw lines -> valid UTF-8 text without BOM / CR: all of each line (field -1), its TSV
  column (an int >= 0) or, for JSON lines (a str), the lines of each record's field."""
  fixed = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="replace",
                                       replacement_char=0xFFFD)
  if stats is not None:
    with tf.control_dependencies([stats.add("invalid_utf8_lines", tf.reduce_sum(
        tf.cast(tf.not_equal(fixed, lines), tf.int64)), path)]):
      fixed = tf.identity(fixed)
  if isinstance(field, str):
    fixed = _json_lines(fixed, field, stats, path)
  fixed = tf.strings.regex_replace(fixed, "^\ufeff|\r+$", "")
  if not isinstance(field, str) and field >= 0:
    cols = tf.strings.split(fixed, sep="\t", maxsplit=field + 1).to_tensor("")
    cols = tf.pad(cols, [[0, 0], [0, field + 1]], constant_values="")
    fixed = cols[:, field]
  if stats is not None:
    fixed = _cut_long_lines(fixed, stats, path)
  return fixed


def _json_lines(records, field: str, stats: Optional[Stats], path):
  """Vector of JSON-lines records -> the lines of their `field` (data/jsonl.py); bad records counted."""
  def parse(batch):
    out, bad = [], 0
    for raw in batch:
      got = jsonl.record_lines(raw.decode("utf-8"), field)
      if got is None:
        bad += 1
      else:
        out += [line.encode("utf-8") for line in got]
    return np.array(out, dtype=object), np.int64(bad)

  lines, bad = tf.numpy_function(parse, [records], [tf.string, tf.int64], stateful=False)
  lines = tf.ensure_shape(lines, [None])
  if stats is None:
    return lines
  with tf.control_dependencies([stats.add("bad_json_records", bad, path)]):
    return tf.identity(lines)


def _cut_long_lines(lines, stats: Stats, path):
  """Lines over `stats.max_line_bytes` -> pieces of at most that many bytes (see module doc)."""
  limit = stats.max_line_bytes
  n = tf.strings.length(lines)
  pieces = tf.maximum((n + limit - 1) // limit, 1)

  def cut():
    k = tf.ragged.range(pieces).flat_values
    parts = tf.strings.substr(tf.repeat(lines, pieces), k * limit, tf.fill(tf.shape(k), limit))
    return tf.strings.unicode_transcode(parts, "UTF-8", "UTF-8", errors="ignore")

  with tf.control_dependencies([stats.add("long_lines_cut", tf.reduce_sum(
      tf.cast(pieces > 1, tf.int64)), path)]):
    return tf.cond(tf.reduce_any(pieces > 1), cut, lambda: tf.identity(lines))


def _line_batches(field, stats: Optional[Stats]):
  """path -> dataset of cleaned line vectors (work per batch: per-element tf.data costs ~µs).

  After the last line of a .gz file, `stats.check_gzip` reads it once more to find a missing
  end-of-stream marker (truncation), which tf.data's reader does not report.
  """
  def read(path):
    gz = tf.strings.regex_full_match(path, r".*\.gz")
    ds = tf.data.TextLineDataset(path, compression_type=tf.where(gz, "GZIP", ""))
    ds = ds.batch(_READ_BATCH).map(as_written(lambda b: _clean_lines(b, field, stats, path)))
    if stats is None:
      return ds
    check = tf.data.Dataset.from_tensors(path).map(as_written(lambda p: tf.reshape(tf.py_function(
        lambda q: (stats.check_gzip(q), tf.zeros([0], tf.string))[1], [p], tf.string), [0])))
    return ds.concatenate(check)
  return as_written(read)


def _is_blank(strings):
  return tf.equal(tf.strings.length(tf.strings.strip(strings)), 0)


def _nonempty_docs(docs, stats: Optional[Stats]):
  """Drops (and counts) empty documents from a vector of documents."""
  keep = tf.logical_not(_is_blank(docs))
  if stats is not None:
    with tf.control_dependencies([stats.add("empty_docs", tf.reduce_sum(
        tf.cast(tf.logical_not(keep), tf.int64)))]):
      keep = tf.identity(keep)
  return tf.boolean_mask(docs, keep)


def _group_blank_lines(line_batches, stats: Optional[Stats]):
  """Line vectors of one file -> vectors of blank-line-separated blocks joined by spaces.

  The block still open at the end of a line batch is carried to the next one (dataset scan);
  a carried block longer than `MAX_BLOCK_CHARS` is emitted as it is (counted in stats as
  `long_blocks_split`): a file without blank lines must not become one unbounded document.
  """
  line_batches = line_batches.concatenate(tf.data.Dataset.from_tensors(tf.constant([""])))

  def step(carry, lines):
    lines = tf.concat([carry[None], lines], 0)
    blank = _is_blank(lines)
    block = tf.cumsum(tf.cast(blank, tf.int32))
    keep = tf.logical_not(blank)
    joined = tf.strings.unsorted_segment_join(tf.boolean_mask(lines, keep),
                                              tf.boolean_mask(block, keep),
                                              num_segments=block[-1] + 1, separator=" ")
    done, carry = joined[:-1], joined[-1]
    too_long = tf.strings.length(carry) >= MAX_BLOCK_CHARS
    if stats is not None:
      with tf.control_dependencies([stats.add("long_blocks_split", tf.cast(too_long, tf.int64),
                                              "a blank_line block")]):
        too_long = tf.identity(too_long)
    done = tf.concat([done, tf.reshape(carry, [1])[:tf.cast(too_long, tf.int32)]], 0)
    carry = tf.where(too_long, "", carry)
    return carry, tf.boolean_mask(done, tf.logical_not(_is_blank(done)))

  return line_batches.scan(tf.constant(""), as_written(step))


def text_lines(spec: Spec, owner: str = "") -> tf.data.Dataset:
  """All cleaned non-empty lines of a text/TSV/JSON-lines source, in file order (tokenizer training)."""
  if spec.kind not in TEXT_KINDS:
    raise DataError(f"source {owner or spec.pattern!r} is {spec.kind}, not text: cannot read lines")
  files = check_files(list_files(spec.pattern, owner), owner, None)
  field = specs.text_field(spec.kind, spec.arg)
  ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
  ds = ds.flat_map(_line_batches(field, None))
  return ds.map(as_written(lambda b: tf.boolean_mask(b, tf.logical_not(_is_blank(b))))).unbatch()


# ------------------------------------------------------------------------------------------
# Documents, per host
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Source(specs.NamedSpec):
  """One named corpus: how to read it, and its size for mixing (n_i in p_i ∝ n_i^alpha)."""
  tfds_data_dir: str = ""

  @property
  def tokenized(self) -> bool:
    return self.spec.kind == "tfrecord"

  def size(self) -> float:
    """Bytes on disk of all files (gz: compressed), or the TFDS split's number of examples."""
    if self.spec.kind == "tfds":
      split = self.spec.arg.split(":")[0]
      return float(self._tfds_builder().info.splits[split].num_examples)
    return float(sum(tf.io.gfile.stat(f).length for f in list_files(self.spec.pattern, self.owner)))

  def documents(self, *, process_index: int = 0, process_count: int = 1,
                doc_format: str = "line", shuffle_seed: Optional[int] = None,
                repeat: bool = False, holdout: str = "", eval_percent: float = 0.0,
                stats: Optional[Stats] = None, num_parallel_reads: int = 4) -> tf.data.Dataset:
    """This host's documents: tf.string (text) or int32 [None] (pre-tokenized).

    Args:
      process_index, process_count: this host and the number of hosts; hosts get disjoint parts.
      doc_format: 'line' (a document per line) or 'blank_line' (blocks of lines).
      shuffle_seed: shuffle the file order every epoch with this seed (None = file order).
      repeat: loop forever (file order reshuffled each epoch).
      holdout: '' (everything), 'train' or 'eval': keep documents whose stable hash falls
        outside / inside the first `eval_percent` percent.
      stats: counters of skipped / repaired input.
      num_parallel_reads: files read concurrently (deterministic interleave).
    """
    if not 0 <= process_index < process_count:
      raise DataError(f"process_index={process_index} not in [0, {process_count})")
    choices.check("data.doc_format", doc_format)
    if self.spec.kind == "tfds":
      ds, key = self._tfds_documents(process_index, process_count, shuffle_seed)
      docs = ds.map(as_written(key)).filter(as_written(lambda d: tf.size(_nonempty_docs(d[None], stats)) > 0))
    else:
      files = check_files(list_files(self.spec.pattern, self.owner), self.owner, stats)
      if not files:
        raise DataError(f"all files of source {self.owner} are empty")
      by_file = len(files) >= process_count
      if by_file:
        files = files[process_index::process_count]
      files_ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
      if shuffle_seed is not None and by_file and len(files) > 1:
        files_ds = files_ds.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)
      if repeat and by_file:
        files_ds = files_ds.repeat()
      cycle = max(1, min(num_parallel_reads, len(files)))
      if self.spec.kind == "tfrecord":
        gz = files[0].endswith(".gz")
        docs = files_ds.interleave(
            as_written(lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP" if gz else "")),
            cycle_length=cycle, block_length=16, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        if not by_file:
          docs = docs.shard(process_count, process_index)
        if holdout:
          docs = docs.filter(as_written(lambda r: _holdout_keep(r, holdout, eval_percent)))
        docs = docs.map(as_written(_parse_tokenized)).filter(as_written(lambda ids: tf.size(ids) > 0))
      else:
        # Text stays in vectors of lines / documents up to the final unbatch: per-element
        # tf.data overhead would otherwise cost more than reading and cleaning the text.
        line_batches = _line_batches(specs.text_field(self.spec.kind, self.spec.arg), stats)
        if doc_format == "blank_line":
          read = as_written(lambda f: _group_blank_lines(line_batches(f), stats))
        else:
          read = line_batches
        batches = files_ds.interleave(read, cycle_length=cycle, block_length=1,
                                      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        batches = batches.map(as_written(lambda b: _nonempty_docs(b, stats)))
        if holdout and by_file:
          batches = batches.map(
              as_written(lambda b: tf.boolean_mask(b, _holdout_keep(b, holdout, eval_percent))))
        docs = batches.unbatch()
        if not by_file:
          docs = docs.shard(process_count, process_index)
          if holdout:
            docs = docs.filter(as_written(lambda d: _holdout_keep(d, holdout, eval_percent)))
      if repeat and not by_file:
        docs = docs.repeat()
      return docs
    if holdout:
      docs = docs.filter(as_written(lambda d: _holdout_keep(d, holdout, eval_percent)))
    return docs.repeat() if repeat else docs   # TFDS shuffles its file order anew each epoch

  def _tfds_builder(self):
    import tensorflow_datasets as tfds
    name = self.spec.pattern
    try:
      return tfds.builder(name, data_dir=self.tfds_data_dir or None)
    except Exception:  # noqa: BLE001 - tfds raises several types, with pages of text
      raise DataError(f"unknown TFDS dataset {name!r}{_of(self.owner)} "
                      f"(data_dir={self.tfds_data_dir or 'default'})") from None

  def _tfds_documents(self, process_index, process_count, shuffle_seed):
    import tensorflow_datasets as tfds
    builder = self._tfds_builder()
    split, feature = self.spec.arg.split(":")
    if not builder.is_prepared():
      raise DataError(f"TFDS dataset {self.spec.pattern!r}{_of(self.owner)} is not prepared in "
                      f"data_dir={self.tfds_data_dir or 'default'} (run `tfds build` first)")
    base_split = re.split(r"[\[+]", split)[0]
    if base_split not in builder.info.splits:
      raise DataError(f"TFDS dataset {self.spec.pattern!r} has no split {base_split!r}"
                      f"{_of(self.owner)}; it has {sorted(builder.info.splits)}")
    if feature not in builder.info.features:
      raise DataError(f"TFDS dataset {self.spec.pattern!r} has no feature {feature!r}"
                      f"{_of(self.owner)}; it has {sorted(builder.info.features)}")
    host_split = tfds.even_splits(split, n=process_count)[process_index]
    read_config = tfds.ReadConfig(shuffle_seed=shuffle_seed, interleave_cycle_length=1)
    ds = builder.as_dataset(split=host_split, shuffle_files=shuffle_seed is not None,
                            read_config=read_config)
    return ds, lambda ex: tf.strings.regex_replace(
        tf.strings.unicode_transcode(ex[feature], "UTF-8", "UTF-8", errors="replace",
                                     replacement_char=0xFFFD), "^\ufeff|\r", "")


def _parse_tokenized(record):
  ex = tf.io.parse_single_example(record, {"input_ids": tf.io.VarLenFeature(tf.int64)})
  return tf.cast(tf.sparse.to_dense(ex["input_ids"]), tf.int32)


def _holdout_keep(keys, holdout, eval_percent):
  """Which documents (text or serialized records, scalar or vector) belong to `holdout`.

  The split is by FarmHash fingerprint of the document, so it is identical on every run, host
  and file order: held-out documents never leak into training.
  """
  if holdout not in ("train", "eval"):
    raise DataError(f"holdout={holdout!r}: expected 'train' or 'eval'")
  in_eval = tf.strings.to_hash_bucket_fast(keys, 10000) < int(round(eval_percent * 100))
  return in_eval if holdout == "eval" else tf.logical_not(in_eval)


def parse_sources(entries: Sequence[str], tfds_data_dir: str = "") -> list:
  """`('en=corpus/en/*.gz', 'tfds:wiki40b/en:train', ...)` -> [Source]; names default to sourceI."""
  return [Source(n.name, n.spec_str, n.spec, tfds_data_dir) for n in specs.parse_named(entries)]
