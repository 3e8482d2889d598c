"""Document sources: formats, per-host sharding, TFDS and TFRecord inputs, bad input."""
import collections
import gzip

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from mlm_jax.data import specs
from mlm_jax.data.text import sources
from mlm_jax.errors import ConfigError, DataError


def _docs(spec, **kw):
  src = sources.parse_sources([f"s={spec}"], kw.pop("tfds_data_dir", ""))[0]
  stats = kw.pop("stats", None)
  ds = src.documents(stats=stats, **kw)
  if src.tokenized:
    return [d.tolist() for d in ds.as_numpy_iterator()]
  return [d.decode("utf-8") for d in sources.numpy_elements(ds)]


def _lines(path, field=None):
  out = []
  with gzip.open(path, "rt", encoding="utf-8-sig") as f:
    for line in f:
      line = line.rstrip("\r\n")
      if field is not None:
        line = line.split("\t")[field]
      if line.strip():
        out.append(line)
  return out


# ------------------------------------------------------------------------------------------
# Formats
# ------------------------------------------------------------------------------------------
def test_line_and_blank_line_formats_strip_bom_and_crlf(tmp_path):
  text = "\ufeffFirst line of doc one\r\nsecond line\r\n\r\n\r\nDoc two\r\n   \r\nDoc three\r\n"
  (tmp_path / "a.txt").write_bytes(text.encode("utf-8"))
  with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
    f.write(text.encode("utf-8"))
  for name in ("a.txt", "b.txt.gz"):
    assert _docs(str(tmp_path / name), doc_format="line") == [
        "First line of doc one", "second line", "Doc two", "Doc three"]
    assert _docs(str(tmp_path / name), doc_format="blank_line") == [
        "First line of doc one second line", "Doc two", "Doc three"]


def test_tsv_field_of_real_leipzig_file(shared_data):
  path = shared_data / "corpus/fr/leipzig/fra_mixed-typical_2012_10K-sentences.txt.gz"
  docs = _docs(f"tsv:1:{path}")
  assert docs == _lines(path, field=1) and len(docs) == 10000
  assert not any("\t" in d for d in docs)


def test_real_gutenberg_blank_line_documents(shared_data):
  path = shared_data / "corpus/de/gutenberg_kalamine/de_alice.txt.gz"
  docs = _docs(str(path), doc_format="blank_line")
  expected, block = [], []
  for line in gzip.open(path, "rt", encoding="utf-8-sig").read().replace("\r", "").split("\n"):
    if line.strip():
      block.append(line)
    elif block:
      expected.append(" ".join(block))
      block = []
  assert docs[0].startswith("The Project Gutenberg") and "\ufeff" not in docs[0]
  assert docs == expected + [" ".join(block)] * bool(block)


# ------------------------------------------------------------------------------------------
# Sharding
# ------------------------------------------------------------------------------------------
def _check_hosts(spec, n_hosts=4, **kw):
  whole = _docs(spec, **kw)
  parts = [_docs(spec, process_index=i, process_count=n_hosts, **kw) for i in range(n_hosts)]
  counts = collections.Counter(d for p in parts for d in p)
  assert counts == collections.Counter(whole)  # union is the corpus, nothing twice
  assert all(parts)
  return whole, parts


def test_four_hosts_by_file(shared_data):
  glob = f"tsv:1:{shared_data}/corpus/*/leipzig/*_mixed-typical_*.gz,{shared_data}/corpus/en/leipzig/eng_news*.gz"
  whole, parts = _check_hosts(glob)
  assert len(whole) == 40000 and all(len(p) == 10000 for p in parts)  # one file each


def test_four_hosts_by_document_when_fewer_files(shared_data):
  path = shared_data / "corpus/ru/tatoeba_cc0_rus.tsv.gz"
  whole, parts = _check_hosts(f"tsv:2:{path}")
  assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_eval_holdout_is_stable_and_disjoint(shared_data):
  spec = f"tsv:1:{shared_data}/corpus/it/leipzig/ita_mixed-typical_2017_10K-sentences.txt.gz"
  train = _docs(spec, holdout="train", eval_percent=5.0)
  held = _docs(spec, holdout="eval", eval_percent=5.0)
  assert sorted(train + held) == sorted(_docs(spec))
  assert 300 < len(held) < 700  # ~5 % of 10k
  assert held == _docs(spec, holdout="eval", eval_percent=5.0)


# ------------------------------------------------------------------------------------------
# TFDS: a real builder writing a small dataset from shared text into a tmp data_dir.
# ------------------------------------------------------------------------------------------
class MlmJaxTinyText(tfds.core.GeneratorBasedBuilder):
  """A few hundred Leipzig sentences as a TFDS dataset (features: text, id)."""
  VERSION = tfds.core.Version("1.0.0")
  SOURCE_LINES = []

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"text": tfds.features.Text(), "id": tf.int64}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(self.SOURCE_LINES[:300]),
            "validation": self._generate_examples(self.SOURCE_LINES[300:])}

  def _generate_examples(self, lines):
    for i, line in enumerate(lines):
      yield i, {"text": line, "id": i}


@pytest.fixture(scope="module")
def tfds_dir(shared_data, tmp_path_factory):
  path = shared_data / "corpus/es/leipzig/spa_news_2023_10K-sentences.txt.gz"
  MlmJaxTinyText.SOURCE_LINES = _lines(path, field=1)[:350]
  data_dir = tmp_path_factory.mktemp("tfds")
  MlmJaxTinyText(data_dir=str(data_dir)).download_and_prepare()
  return str(data_dir)


def test_tfds_source_reads_prepared_builder(tfds_dir):
  docs = _docs("tfds:mlm_jax_tiny_text:train", tfds_data_dir=tfds_dir)
  assert collections.Counter(docs) == collections.Counter(MlmJaxTinyText.SOURCE_LINES[:300])
  assert len(_docs("tfds:mlm_jax_tiny_text:validation:text", tfds_data_dir=tfds_dir)) == 50
  src = sources.parse_sources(["tfds:mlm_jax_tiny_text:train"], tfds_dir)[0]
  assert src.size() == 300


def test_tfds_four_hosts(tfds_dir):
  _check_hosts("tfds:mlm_jax_tiny_text:train", tfds_data_dir=tfds_dir)


# ------------------------------------------------------------------------------------------
# TFRecords of pre-tokenized documents
# ------------------------------------------------------------------------------------------
def test_tfrecord_source_and_hosts(tmp_path):
  docs = [[5, 6, 7], [8], list(range(10, 400)), [11, 12]]
  for shard in range(2):
    with tf.io.TFRecordWriter(str(tmp_path / f"tok-{shard}.tfrecord")) as w:
      for ids in docs[shard::2]:
        ex = tf.train.Example(features=tf.train.Features(feature={
            "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}))
        w.write(ex.SerializeToString())
  got = _docs(f"tfrecord:{tmp_path}/tok-*.tfrecord")
  assert sorted(got) == sorted(docs)
  parts = [_docs(f"tfrecord:{tmp_path}/tok-*.tfrecord", process_index=i, process_count=2)
           for i in range(2)]
  assert sorted(parts[0] + parts[1]) == sorted(docs) and all(parts)


def test_a_store_prepared_from_tfrecords_and_tfds_holds_every_document_in_input_order(
    tfds_dir, corpus_and_tokenizer, tmp_path):
  """prepare_data reads TFRecord and TFDS sources in blocks (sources.READ_BLOCK): every record of a file
  of a block and a part, in order, and every TFDS example's text, tokenized, in the split's order."""
  import numpy as np
  from mlm_jax.data.store import prepare, shards
  from mlm_jax.data.tokenizers import load as tokenizer_load
  rng = np.random.default_rng(0)
  docs = [rng.integers(5, 1000, rng.integers(1, 12)).tolist() for _ in range(sources.READ_BLOCK + 500)]
  with tf.io.TFRecordWriter(str(tmp_path / "ids.tfrecord")) as w:
    for ids in docs:
      w.write(tf.train.Example(features=tf.train.Features(feature={
          "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))})).SerializeToString())
  opts = prepare.Options(sources=(f"ids=tfrecord:{tmp_path}/ids.tfrecord", "es=tfds:mlm_jax_tiny_text:train:text"),
                         tokenizer=corpus_and_tokenizer[1], eval_percent=0.0, tfds_data_dir=tfds_dir)
  prepare.prepare(opts, str(tmp_path / "store"), progress_s=1e9, log=lambda s: None)
  store = shards.Store(str(tmp_path / "store"))
  held = lambda name: [d.ids.tolist() for d in store.read(name, "train", np.arange(store.lengths(name, "train").size))]
  assert held("ids") == docs
  tok = tokenizer_load.load(corpus_and_tokenizer[1])
  texts = [ex["text"].decode() for ex in tfds.builder("mlm_jax_tiny_text", data_dir=tfds_dir).as_dataset(
      split="train").as_numpy_iterator()]
  assert len(texts) == 300 and held("es") == [tok.encode(t) for t in texts]


# ------------------------------------------------------------------------------------------
# Bad input: one clear line naming the culprit; repairs are counted
# ------------------------------------------------------------------------------------------
def _one_line(excinfo):
  msg = str(excinfo.value)
  assert "\n" not in msg
  return msg


def test_glob_without_match(tmp_path):
  with pytest.raises(DataError) as e:
    _docs(f"{tmp_path}/nope/*.txt")
  assert _one_line(e) == f"no files match '{tmp_path}/nope/*.txt' (source s={tmp_path}/nope/*.txt)"


def test_unreadable_file_directory(tmp_path):
  (tmp_path / "d.txt").mkdir()
  (tmp_path / "ok.txt").write_text("fine\n")
  with pytest.raises(DataError) as e:
    _docs(f"{tmp_path}/*.txt")
  assert _one_line(e).startswith(f"cannot read {tmp_path}/d.txt (source s=") \
      and _one_line(e).endswith("is a directory")


def test_unreadable_file_corrupt_gzip(tmp_path):
  (tmp_path / "bad.txt.gz").write_bytes(b"this is not gzip data at all")
  with pytest.raises(DataError) as e:
    _docs(f"{tmp_path}/bad.txt.gz")
  assert _one_line(e).startswith(f"cannot read {tmp_path}/bad.txt.gz (source s=")


def test_unknown_tfds_name(tmp_path):
  with pytest.raises(DataError) as e:
    _docs("tfds:no_such_dataset_xyz/en:train", tfds_data_dir=str(tmp_path))
  assert _one_line(e) == (f"unknown TFDS dataset 'no_such_dataset_xyz/en' (source "
                          f"s=tfds:no_such_dataset_xyz/en:train) (data_dir={tmp_path})")
  with pytest.raises(DataError) as e:
    specs.parse_spec("tfds:onlyname")
  assert "tfds:NAME[/CONFIG]:SPLIT" in _one_line(e)


def test_tfds_unknown_split_or_feature(tfds_dir):
  with pytest.raises(DataError, match="has no split 'test'.*'train', 'validation'"):
    _docs("tfds:mlm_jax_tiny_text:test", tfds_data_dir=tfds_dir)
  with pytest.raises(DataError, match="has no feature 'body'"):
    _docs("tfds:mlm_jax_tiny_text:train:body", tfds_data_dir=tfds_dir)


def test_empty_files_and_documents_skipped_and_counted(tmp_path):
  (tmp_path / "a.txt").write_text("")
  with gzip.open(tmp_path / "b.txt.gz", "wb"):
    pass
  (tmp_path / "c.txt").write_text("one\n\n  \ntwo\n\t\n")
  stats = sources.Stats()
  assert _docs(f"{tmp_path}/*", stats=stats) == ["one", "two"]
  assert stats.as_dict() == dict(empty_files=2, empty_docs=3, invalid_utf8_lines=0,
                                 long_docs_split=0, long_blocks_split=0, long_lines_cut=0,
                                 truncated_files=0, bad_json_records=0)
  assert sorted(stats.empty_files) == [f"{tmp_path}/a.txt", f"{tmp_path}/b.txt.gz"]
  with pytest.raises(DataError) as e:
    _docs(f"{tmp_path}/a.txt")
  assert _one_line(e) == f"all files of source s={tmp_path}/a.txt are empty"


def test_invalid_utf8_replaced_and_counted(tmp_path):
  (tmp_path / "bad.txt").write_bytes(b"caf\xe9 ok\nfine line\n\xff\xfe\xfd\nend \xc3\n")
  stats = sources.Stats()
  docs = _docs(str(tmp_path / "bad.txt"), stats=stats)
  assert docs == ["caf\ufffd ok", "fine line", "\ufffd\ufffd\ufffd", "end \ufffd"]
  assert stats.as_dict()["invalid_utf8_lines"] == 3


def test_blank_line_file_without_blank_lines_is_cut_not_dropped(tmp_path):
  lines = [f"line {i} " + "x" * 90 for i in range(2000)]  # ~200 kB, not one blank line
  (tmp_path / "wall.txt").write_text("\n".join(lines) + "\n")
  stats = sources.Stats()
  docs = _docs(str(tmp_path / "wall.txt"), doc_format="blank_line", stats=stats)
  assert " ".join(docs) == " ".join(lines)
  # cut at the first line batch (256 lines of ~100 chars here) that reaches the limit
  assert all(specs.MAX_BLOCK_CHARS <= len(d) < 2 * specs.MAX_BLOCK_CHARS for d in docs[:-1])
  assert len(docs) > 3
  assert stats.as_dict()["long_blocks_split"] == sum(
      len(d) >= specs.MAX_BLOCK_CHARS for d in docs)


def test_bad_specs():
  with pytest.raises(DataError, match="expected tsv:FIELD:GLOB"):
    specs.parse_spec("tsv:x:foo")
  with pytest.raises(DataError, match="duplicate source name 'a'"):
    sources.parse_sources(["a=x", "a=y"])
  with pytest.raises(ConfigError, match="data.doc_format='para'"):
    _docs("x.txt", doc_format="para")


def test_a_repeated_source_name_fails_before_the_tokenizer_is_trained(tmp_path):
  """The run's one line comes at once, not after the minutes of training a tokenizer it cannot use."""
  from mlm_jax.config.defaults import default_config
  from mlm_jax.training import provision
  (tmp_path / "a.txt").write_text("some text\n" * 50)
  c = default_config()
  c.data.sources = (f"en={tmp_path / 'a.txt'}", f"en={tmp_path / 'a.txt'}")
  with pytest.raises(DataError, match="duplicate source name 'en'"):
    provision.pretraining(c, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "tokenizer").exists()


def test_tfds_source_repeats_for_training(tfds_dir):
  """A training source loops: a TFDS split ends after one epoch otherwise (the run dies with
  StopIteration, or the source drops out of a mix), as file sources never do."""
  src = sources.parse_sources(["tfds:mlm_jax_tiny_text:train"], tfds_dir)[0]
  ds = src.documents(repeat=True, shuffle_seed=1).batch(250)
  seen = [d.decode("utf-8") for b in ds.take(3).as_numpy_iterator() for d in b]
  assert len(seen) == 750   # two and a half epochs of 300
  assert collections.Counter(seen[:600]) == collections.Counter(MlmJaxTinyText.SOURCE_LINES[:300] * 2)
