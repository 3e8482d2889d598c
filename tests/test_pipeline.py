"""Packed batches from real text: nothing lost or duplicated, boundaries, mixing, exact resume."""
import collections
import gzip
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from mlm_jax.config import defaults
from mlm_jax.data import specs
from mlm_jax.data.store import shards
from mlm_jax.data.store import prepare
from mlm_jax.data.store import text_reader
from mlm_jax.data.text import stream
from mlm_jax.data.text import sources
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import ConfigError, DataError

ALICE = "corpus/de/gutenberg_kalamine/de_alice.txt.gz"          # blank-line paragraphs, BOM+CRLF
LEIPZIG_EN = "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"
RU = "corpus/ru/tatoeba_cc0_rus.tsv.gz"


@pytest.fixture(scope="session")
def tok(shared_data, tmp_path_factory):
  """A 1000-piece XLM-R-layout model on German, English and Russian (a few seconds)."""
  root = tmp_path_factory.mktemp("pipe_tok")
  return spm_training.train([f"de={shared_data / ALICE}", f"en=tsv:1:{shared_data / LEIPZIG_EN}",
                          f"ru=tsv:2:{shared_data / RU}"], str(root / "spm"), vocab_size=1000,
                         max_sentences_per_language=3000, input_sentence_size=6000,
                         verbose=False)


def _cfg(**kw):
  c = defaults.data_defaults()
  c.eval_percent = 0.0
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def _epoch(cfg, tok, batch_size=8, seed=0, **kw):
  ds = stream.build_dataset(cfg, tok, batch_size, seed, repeat=False, **kw)
  return list(ds.as_numpy_iterator())


def _direct_docs(cfg):
  """The documents exactly as the sources give them (one epoch, file order)."""
  out = []
  for src in sources.parse_sources(cfg.sources, cfg.tfds_data_dir):
    ds = src.documents(doc_format=cfg.doc_format)
    out += [d.decode("utf-8") for b in ds.batch(4096).as_numpy_iterator() for d in b]
  return out


_STARTS = {}


def _starts_word(tok):
  """Per id: 1 if its piece begins with '▁' (computed here, not by the code under test)."""
  if tok.model_path not in _STARTS:
    _STARTS[tok.model_path] = np.array(
        [int(tok.id_to_piece(i).startswith("\u2581")) for i in range(tok.vocab_size)])
  return _STARTS[tok.model_path]


def _segments(batches, tok, seq_len):
  """Checks every row's structure; returns the token chunks (without BOS/EOS), in order."""
  chunks = []
  for b in batches:
    assert set(b) == set(stream.FEATURES)
    for k in stream.FEATURES:
      assert b[k].dtype == np.int32 and b[k].shape[1] == seq_len
    for ids, seg, pos, ws in zip(b["input_ids"], b["segment_ids"], b["positions"],
                                 b["word_starts"]):
      n = int((seg > 0).sum())
      assert (seg[:n] > 0).all() and (seg[n:] == 0).all()           # padding only at the end
      assert (ids[n:] == tok.pad_id).all() and (pos[n:] == 0).all() and (ws[n:] == 0).all()
      if n == 0:
        continue
      assert seg[0] == 1 and set(np.diff(seg[:n])) <= {0, 1}         # documents 1, 2, 3, ...
      for s in range(1, seg.max() + 1):
        idx = np.flatnonzero(seg == s)
        assert (pos[idx] == np.arange(len(idx))).all()               # positions restart
        doc = ids[idx]
        assert doc[0] == tok.bos_id and doc[-1] == tok.eos_id and len(doc) >= 3
        body = doc[1:-1]
        assert not set(body.tolist()) & {tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id}
        expected_ws = [1] + _starts_word(tok)[body[1:]].tolist()
        assert ws[idx].tolist() == [1] + expected_ws + [1]
        chunks.append(tuple(body.tolist()))
  return chunks


def _expected_chunks(tok, docs, max_len):
  out = []
  for d in docs:
    ids = tok.encode(d)
    out += [tuple(ids[i:i + max_len]) for i in range(0, len(ids), max_len)]
  return out


def _tokens(chunks):
  return collections.Counter(t for c in chunks for t in c)


@pytest.mark.parametrize("seq_len", [64, 24])
def test_segmented_epoch_loses_and_duplicates_nothing(shared_data, tok, seq_len):
  cfg = _cfg(sources=(f"alice={shared_data / ALICE}",), doc_format="blank_line",
             seq_len=seq_len, shuffle_buffer=500)
  stats = sources.Stats()
  batches = _epoch(cfg, tok, stats=stats)
  got = _segments(batches, tok, seq_len)
  want = _expected_chunks(tok, _direct_docs(cfg), seq_len - 2)
  assert _tokens(got) == _tokens(want)                 # the multiset of tokens
  assert collections.Counter(got) == collections.Counter(want)  # and of whole documents/chunks
  assert got != want  # shuffled
  n_long = sum(len(tok.encode(d)) > seq_len - 2 for d in _direct_docs(cfg))
  assert n_long > 0 and stats.as_dict()["long_docs_split"] == n_long  # split, never dropped
  # rows are well filled: only the last batch may carry padding rows
  fill = np.mean([(b["segment_ids"] > 0).mean() for b in batches[:-1]])
  assert fill > 0.75


def test_concat_epoch_is_the_document_stream(shared_data, tok):
  seq_len = 48
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}",), packing="concat",
             seq_len=seq_len, shuffle_buffer=0, shuffle_files=False)
  batches = _epoch(cfg, tok, batch_size=16)
  ids = np.concatenate([b["input_ids"] for b in batches])
  seg = np.concatenate([b["segment_ids"] for b in batches])
  pos = np.concatenate([b["positions"] for b in batches])
  ws = np.concatenate([b["word_starts"] for b in batches])
  real = seg.reshape(-1) > 0
  assert real[:real.sum()].all()  # all rows full except the very end
  assert (pos[seg > 0] == np.tile(np.arange(seq_len), len(ids))[real]).all()
  assert (ws[:, 0][seg[:, 0] > 0] == 1).all() and (ws[seg == 0] == 0).all()
  flat = ids.reshape(-1)[real].tolist()
  want = []
  for d in _direct_docs(cfg):
    want += [tok.bos_id] + tok.encode(d) + [tok.eos_id]
  assert flat == want


def test_eval_split_holdout_is_finite_and_disjoint(shared_data, tok):
  cfg = _cfg(sources=(f"de={shared_data / ALICE}",), eval_percent=10.0, seq_len=64)
  ev = list(stream.Pipeline(cfg, tok, 16, 0, split="eval"))
  train = _epoch(cfg, tok, batch_size=16)
  ev_chunks, tr_chunks = _segments(ev, tok, 64), _segments(train, tok, 64)
  all_chunks = _expected_chunks(tok, _direct_docs(cfg), 62)
  assert collections.Counter(ev_chunks) + collections.Counter(tr_chunks) == \
      collections.Counter(all_chunks)
  assert 0.05 < len(ev_chunks) / len(all_chunks) < 0.15
  assert all(b["input_ids"].shape == (16, 64) for b in ev)
  assert (ev[-1]["segment_ids"][-1] == 0).all()  # the last batch is filled with padding rows
  again = list(stream.Pipeline(cfg, tok, 16, 0, split="eval"))
  assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(ev, again))
  # The trainer builds its eval pipeline once and rewinds it for every evaluation.
  reused = stream.Pipeline(cfg, tok, 16, 0, split="eval")
  next(reused), next(reused)
  reused.rewind()
  rewound = list(reused)
  assert len(rewound) == len(ev) and all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(ev, rewound))


def test_mixing_frequencies_follow_alpha(shared_data, tok):
  names = ("en", "de", "ru")
  sizes = (1000.0, 100.0, 10.0)
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"de={shared_data / ALICE}",
                      f"ru=tsv:2:{shared_data / RU}"),
             source_sizes=tuple(f"{n}={s}" for n, s in zip(names, sizes)),
             mix_alpha=0.3, seq_len=16, shuffle_buffer=100)
  ds = stream.build_dataset(cfg, tok, 500, seed=3, with_source=True)
  src = np.concatenate([b["source"] for b in ds.take(20).as_numpy_iterator()])
  assert len(src) == 10000
  freq = np.bincount(src, minlength=3) / len(src)
  want = np.array(specs.mixing_weights(sizes, 0.3))
  np.testing.assert_allclose(want, np.array(sizes) ** 0.3 / np.sum(np.array(sizes) ** 0.3))
  assert np.abs(freq - want).max() < 0.02, (freq, want)
  # Default n_i = bytes on disk of each source's files.
  cfg.source_sizes = ()
  srcs = sources.parse_sources(cfg.sources)
  assert [s.size() for s in srcs][0] == (shared_data / LEIPZIG_EN).stat().st_size


def test_each_sources_drawn_rows_and_tokens_are_counted(shared_data, tok):
  """The log's data/NAME/tokens of a streaming run: exact over a whole epoch; in a mixed stream at least the
  tokens of the batches handed out and at most a bounded prefetch more, and after a resume counted from the
  stream's first row."""
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"ru=tsv:2:{shared_data / RU}"),
             seq_len=32, shuffle_buffer=0)
  st = stream.new_stats(cfg)
  epoch = _epoch(cfg, tok, batch_size=64, stats=st, with_source=True)
  real = np.concatenate([(b["segment_ids"] > 0).sum(1) for b in epoch])
  src = np.concatenate([b["source"] for b in epoch])
  drawn = st.drawn()
  for i, name in enumerate(("en", "ru")):
    mine = (src == i) & (real > 0)   # the last batch's padding rows have source 0 and no tokens
    assert drawn[name]["rows_local"] == mine.sum() and drawn[name]["tokens_local"] == real[mine].sum() > 0

  cfg.update(dict(source_sizes=("en=1000", "ru=100"), mix_alpha=0.5, shuffle_buffer=100))
  n, extra, batch = 30, 30, 16
  ref = stream.build_dataset(cfg, tok, batch, seed=3, with_source=True).take(n + extra).as_numpy_iterator()
  cum = np.cumsum([[(b["segment_ids"] > 0).sum(1)[b["source"] == i].sum() for i in (0, 1)] for b in ref], axis=0)
  run = stream.Pipeline(cfg, tok, batch, seed=3)
  for _ in range(n):
    next(run)
  got = run.stats()["sources"]
  for i, name in enumerate(("en", "ru")):
    assert cum[n - 1, i] <= got[name]["tokens"] <= cum[-1, i], (name, got, cum[n - 1], cum[-1])
  assert got["ru"]["weight"] == pytest.approx(specs.mixing_weights([1000, 100], 0.5)[1])
  again = stream.Pipeline(cfg, tok, batch, seed=3)
  again.set_state(run.get_state())
  next(again)
  assert cum[n, 0] <= again.stats()["sources"]["en"]["tokens"] <= cum[-1, 0]


def test_hosts_draw_the_mix_independently(shared_data, tok):
  """With data.per_host='shard' each of P hosts samples its own rows' sources: a step's share of a
  language then varies as one draw of the global batch (binomial), not P times more as when every host
  drew with the same seed (row j of each host from the same source)."""
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"ru=tsv:2:{shared_data / RU}"),
             source_sizes=("en=1000", "ru=100"), mix_alpha=1.0, seq_len=16, shuffle_buffer=0)
  hosts, local, steps = 4, 25, 40
  drawn = np.stack([np.concatenate([b["source"] for b in stream.build_dataset(
      cfg, tok, local, seed=3, process_index=i, process_count=hosts, with_source=True).take(steps).as_numpy_iterator()])
      for i in range(hosts)])   # [host, steps * local]: 1 where the row is Russian
  assert len({row.tobytes() for row in drawn}) == hosts, "hosts drew the same sources"
  p = 100 / 1100
  assert abs(drawn.mean() - p) < 0.02, drawn.mean()
  share = drawn.reshape(hosts, steps, local).sum(axis=(0, 2)) / (hosts * local)   # per global step
  ratio = share.var(ddof=1) / (p * (1 - p) / (hosts * local))   # ~1 when independent, ~hosts when copied
  assert 0.3 < ratio < 2.0, ratio


def test_resume_gives_identical_batches(shared_data, tok):
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"de={shared_data / ALICE}"),
             mix_alpha=0.5, seq_len=32, shuffle_buffer=100)
  k, n = 7, 20
  run = stream.Pipeline(cfg, tok, 4, seed=11)
  for _ in range(k):
    next(run)
  state = json.loads(json.dumps(run.get_state()))  # as the checkpoint stores it
  assert state["batches"] == k and len(json.dumps(state)) < 400
  uninterrupted = [next(run) for _ in range(n)]

  resumed = stream.Pipeline(cfg, tok, 4, seed=11)
  resumed.set_state(state)
  for want in uninterrupted:
    got = next(resumed)
    for key in stream.FEATURES:
      np.testing.assert_array_equal(got[key], want[key])
  assert resumed.get_state()["batches"] == k + n


def test_every_process_resumes_its_own_part_from_process_0s_state(shared_data, tok):
  """orbax writes the data position on the primary host only: with data.per_host='shard' each process
  restores process 0's state and must continue its own part of the corpus; another process count
  cannot replay those parts and is refused in one line that says what to do."""
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}", f"de={shared_data / ALICE}"),
             mix_alpha=0.5, seq_len=32, shuffle_buffer=100)
  k, n = 5, 4
  hosts = [stream.Pipeline(cfg, tok, 4, seed=11, process_index=i, process_count=2) for i in range(2)]
  for p in hosts:
    for _ in range(k):
      next(p)
  saved = json.loads(json.dumps(hosts[0].get_state()))
  want = [next(hosts[1]) for _ in range(n)]
  resumed = stream.Pipeline(cfg, tok, 4, seed=11, process_index=1, process_count=2)
  resumed.set_state(saved)
  for w in want:
    got = next(resumed)
    for key in stream.FEATURES:
      np.testing.assert_array_equal(got[key], w[key])
  with pytest.raises(DataError) as e:
    stream.Pipeline(cfg, tok, 2, seed=11, process_index=0, process_count=4).set_state(saved)
  msg = str(e.value)
  assert "\n" not in msg and "on 4 processes" in msg and "Rerun on 2 processes" in msg and "token store" in msg, msg


def test_resume_refuses_a_different_stream(shared_data, tok, corpus_and_tokenizer):
  cfg = _cfg(sources=(f"en=tsv:1:{shared_data / LEIPZIG_EN}",), seq_len=32)
  state = stream.Pipeline(cfg, tok, 4, seed=0).get_state()
  cfg.packing = "concat"
  with pytest.raises(DataError) as e:
    stream.Pipeline(cfg, tok, 4, seed=0).set_state(state)
  assert "\n" not in str(e.value) and "the data config differs" in str(e.value)
  with pytest.raises(DataError, match="batch_size differs"):
    stream.Pipeline(cfg, tok, 8, seed=0).set_state(dict(state, fingerprint=None))
  # another tokenizer of the same vocabulary size (the session's, trained on other text)
  other = tokenizer_load.load(corpus_and_tokenizer[1])
  assert other.vocab_size == tok.vocab_size and other.sha256 != tok.sha256
  state = stream.Pipeline(cfg, tok, 4, seed=0).get_state()
  with pytest.raises(DataError, match="the data config differs"):
    stream.Pipeline(cfg, other, 4, seed=0).set_state(state)


def _text_corpus(shared_data, folder, lines=3000):
  """A plain-text copy of the first `lines` English sentences, as folder/en/part.txt."""
  with gzip.open(shared_data / LEIPZIG_EN, "rt", encoding="utf-8") as f:
    text = "".join(line.split("\t", 1)[1] for _, line in zip(range(lines), f))
  (folder / "en").mkdir(parents=True)
  (folder / "en" / "part.txt").write_text(text, encoding="utf-8")


def test_a_moved_corpus_resumes_and_a_changed_one_is_refused(shared_data, tok, tmp_path):
  """The fingerprint holds the files' names under their glob's root, sizes and sampled hashes, not
  their paths: the corpus copied elsewhere resumes onto the same batches; a file edited is refused. (A
  state written when the fingerprint held the paths: tests/test_migrate.py.)"""
  here, there = tmp_path / "disk1" / "corpus", tmp_path / "disk2" / "moved"
  _text_corpus(shared_data, here)
  cfg = lambda root: _cfg(sources=(f"en={root}/*/*.txt",), seq_len=32, shuffle_buffer=50)
  run = stream.Pipeline(cfg(here), tok, 4, seed=3)
  for _ in range(3):
    next(run)
  state = json.loads(json.dumps(run.get_state()))
  want = next(run)
  shutil.copytree(here, there)
  moved = stream.Pipeline(cfg(there), tok, 4, seed=3)
  moved.set_state(state)
  got = next(moved)
  assert all((got[k] == want[k]).all() for k in stream.FEATURES)
  with open(there / "en" / "part.txt", "a", encoding="utf-8") as f:
    f.write("One more sentence that changes the stream.\n")
  with pytest.raises(DataError, match="the data config differs"):
    stream.Pipeline(cfg(there), tok, 4, seed=3).set_state(state)


def test_hosts_cover_the_epoch(shared_data, tok):
  cfg = _cfg(sources=(f"de={shared_data / ALICE}",), doc_format="blank_line", seq_len=64)
  per_host = [_segments(stream.build_dataset(cfg, tok, 4, 0, process_index=i, process_count=2,
                                               repeat=False).as_numpy_iterator(), tok, 64)
              for i in range(2)]
  assert all(per_host)
  want = _expected_chunks(tok, _direct_docs(cfg), 62)
  assert collections.Counter(c for h in per_host for c in h) == collections.Counter(want)


class MlmJaxPipelineText(tfds.core.GeneratorBasedBuilder):
  """Russian Tatoeba sentences as a real TFDS dataset, written to a tmp data_dir."""
  VERSION = tfds.core.Version("1.0.0")
  LINES = []

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"sentence": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for i, line in enumerate(self.LINES):
      yield i, {"sentence": line}


def test_tfds_spec_through_pipeline(shared_data, tok, tmp_path):
  with gzip.open(shared_data / RU, "rt", encoding="utf-8") as f:
    MlmJaxPipelineText.LINES = [next(f).rstrip("\n").split("\t")[2] for _ in range(400)]
  MlmJaxPipelineText(data_dir=str(tmp_path)).download_and_prepare()
  cfg = _cfg(sources=("ru=tfds:mlm_jax_pipeline_text:train:sentence",),
             tfds_data_dir=str(tmp_path), seq_len=64)
  got = _segments(_epoch(cfg, tok), tok, 64)
  assert collections.Counter(got) == collections.Counter(
      _expected_chunks(tok, MlmJaxPipelineText.LINES, 62))
  # and prepared into a token store: the same documents
  docs = _prepared(cfg, tok, tmp_path, "ru")
  assert collections.Counter(tuple(d.ids.tolist()) for d in docs) == collections.Counter(
      tuple(tok.encode(line)) for line in MlmJaxPipelineText.LINES)


def _prepared(cfg, tok, tmp_path, name):
  root = str(tmp_path / "store")
  prepare.prepare(prepare.Options(sources=tuple(cfg.sources), tokenizer=tok.model_path, eval_percent=0.0,
                                  tfds_data_dir=cfg.tfds_data_dir), root, progress_s=1e9, log=lambda s: None)
  st = shards.Store(root)
  return st.read(name, "train", np.arange(st.lengths(name, "train").size))


def test_pretokenized_tfrecords_through_pipeline(tok, tmp_path):
  docs = [tok.encode("Ein kurzer Satz."), tok.encode("Noch einer, etwas länger als der erste."),
          list(range(10, 200))]
  with tf.io.TFRecordWriter(str(tmp_path / "t.tfrecord")) as w:
    for ids in docs:
      w.write(tf.train.Example(features=tf.train.Features(feature={"input_ids": tf.train.Feature(
          int64_list=tf.train.Int64List(value=ids))})).SerializeToString())
  cfg = _cfg(sources=(f"tok=tfrecord:{tmp_path}/*.tfrecord",), seq_len=32)
  got = _segments(_epoch(cfg, tok, batch_size=2), tok, 32)
  want = [tuple(d[i:i + 30]) for d in docs for i in range(0, len(d), 30)]
  assert collections.Counter(got) == collections.Counter(want)
  stored = _prepared(cfg, tok, tmp_path, "tok")            # and prepared into a token store
  assert [d.ids.tolist() for d in stored] == docs
  table = np.asarray(tok.word_start_table())
  assert stored[1].word_starts[1:].tolist() == table[docs[1][1:]].tolist()


def test_bad_input_through_pipeline(tok, tmp_path):
  """Empty files, empty documents, invalid UTF-8 and a 200k-character line: all handled."""
  (tmp_path / "empty.txt").write_text("")
  long_doc = " ".join(["Wort"] * 8000)
  (tmp_path / "mixed.txt").write_bytes(b"gut\n\n\xff\xfe kaputt\n" + long_doc.encode() + b"\n")
  cfg = _cfg(sources=(f"x={tmp_path}/*.txt",), seq_len=128, shuffle_buffer=4)
  p = stream.Pipeline(cfg, tok, 8, 0)
  stats = sources.Stats()
  batches = _epoch(cfg, tok, stats=stats)
  got = _segments(batches, tok, 128)
  want = _expected_chunks(tok, ["gut", "\ufffd\ufffd kaputt", long_doc], 126)
  assert collections.Counter(got) == collections.Counter(want)
  assert stats.as_dict() == dict(empty_files=1, empty_docs=1, invalid_utf8_lines=1,
                                 long_docs_split=1, long_blocks_split=0, long_lines_cut=0,
                                 truncated_files=0, bad_json_records=0)
  next(p)  # the repeating train stream runs too
  assert p.stats()["empty_files"] == 1


def test_jsonl_source_both_paths(tok, tmp_path):
  """`jsonl:FIELD:GLOB`: each record's field read as a file of its own lines (a record ends its last
  block); records that are not objects with a string field are skipped and counted, on the streaming
  path and in a token store alike, which hold the same documents."""
  records = [json.dumps({"id": 1, "text": "Erste Zeile.\r\nzweite Zeile.\n\nNeuer Absatz."}),
             "", json.dumps({"text": "Grüße \"zitiert\" \ud800 Ende"}, ensure_ascii=True),
             json.dumps({"title": "kein Text"}), '{"text": "abgeschnitten', json.dumps({"text": 5}),
             json.dumps(["text"]), json.dumps({"text": "Letzter Satz.", "more": {"text": "x"}})]
  with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as f:
    f.write("\ufeff" + "\n".join(records) + "\n")
  by_format = {"blank_line": ["Erste Zeile. zweite Zeile.", "Neuer Absatz.", 'Grüße "zitiert" ? Ende',
                              "Letzter Satz."],
               "line": ["Erste Zeile.", "zweite Zeile.", "Neuer Absatz.", 'Grüße "zitiert" ? Ende',
                        "Letzter Satz."]}
  for doc_format, want in by_format.items():
    cfg = _cfg(sources=(f"j=jsonl:text:{tmp_path}/*.jsonl.gz",), doc_format=doc_format, seq_len=64)
    assert _direct_docs(cfg) == want
    stats = sources.Stats()
    got = _segments(_epoch(cfg, tok, stats=stats), tok, 64)
    assert collections.Counter(got) == collections.Counter(_expected_chunks(tok, want, 62))
    assert stats.as_dict()["bad_json_records"] == 4 and stats.as_dict()["invalid_utf8_lines"] == 0
    opts = prepare.Options(sources=tuple(cfg.sources), tokenizer=tok.model_path, eval_percent=0.0,
                           doc_format=doc_format)
    manifest = prepare.prepare(opts, str(tmp_path / doc_format), progress_s=1e9, log=lambda s: None)
    assert manifest["sources"]["j"]["stats"]["bad_json_records"] == 4
    st = shards.Store(str(tmp_path / doc_format))
    stored = st.read("j", "train", np.arange(st.lengths("j", "train").size))
    assert [d.ids.tolist() for d in stored] == [tok.encode(d) for d in want]
  lines = sources.text_lines(specs.parse_spec(f"jsonl:text:{tmp_path}/*.jsonl.gz"))   # tokenizer training's
  assert [b.decode() for b in lines.as_numpy_iterator()] == by_format["line"]
  # a long line of a record is cut at character boundaries, as a long text line is
  (tmp_path / "long.jsonl").write_text(json.dumps({"text": "ä" * 20 + "\nkurz"}) + "\n", encoding="utf-8")
  counters = text_reader.Counters()
  pieces = list(text_reader.lines(str(tmp_path / "long.jsonl"), "text", 15, counters))
  assert pieces == ["ä" * 7, "ä" * 7, "ä" * 6, "kurz", ""] and counters["long_lines_cut"] == 1
  with pytest.raises(DataError, match="line 1 is not a JSON object with a string 'body'"):
    list(text_reader.lines(str(tmp_path / "long.jsonl"), "body", 0, text_reader.Counters(strict=True)))
  with pytest.raises(DataError, match="expected jsonl:FIELD:GLOB"):
    specs.parse_spec("jsonl:/data/*.jsonl")


def test_config_errors(shared_data, tok):
  with pytest.raises(DataError, match="no data sources configured for split 'train'"):
    stream.Pipeline(_cfg(), tok, 4, 0)
  with pytest.raises(ConfigError, match="data.packing='full'"):
    stream.Pipeline(_cfg(sources=("a=x",), packing="full"), tok, 4, 0)
  with pytest.raises(DataError, match="no files match"):
    stream.Pipeline(_cfg(sources=(f"a={shared_data}/corpus/xx/*.gz",)), tok, 4, 0)
  with pytest.raises(DataError, match="data.source_sizes names unknown sources"):
    stream.Pipeline(_cfg(sources=(f"a={shared_data / ALICE}", f"b={shared_data / ALICE}"),
                           source_sizes=("c=1",)), tok, 4, 0)


def test_best_fit_rows_and_next_fit_runs_resume_again_and_again(shared_data, tok):
  """Best-fit over a window spanning tokenized batches fills rows that next-fit leaves ~15 % empty;
  a run on next-fit rows (its state names 'next') resumes onto them under the best-fit default at every
  resume, not only the first; an explicit 'next' is not adopted. (States from before data.packing_fit:
  tests/test_migrate.py.)"""
  src = (f"en=tsv:1:{shared_data / LEIPZIG_EN}",)
  share = {}
  for fit in ("next", "best"):
    p = stream.Pipeline(_cfg(sources=src, seq_len=128, packing_fit=fit), tok, 8, seed=0)
    share[fit] = np.mean([(next(p)["segment_ids"] > 0).mean() for _ in range(20)])
  assert share["best"] > 0.97 and share["best"] > share["next"] + 0.05, share
  old = stream.Pipeline(_cfg(sources=src, seq_len=64, packing_fit="next"), tok, 4, seed=0)
  for _ in range(3):
    next(old)
  named = json.loads(json.dumps(old.get_state()))
  want = [next(old) for _ in range(3)]
  first = stream.Pipeline(_cfg(sources=src, seq_len=64), tok, 4, seed=0)
  assert first.fit == "best" and first.adopted_config() == {}
  first.set_state(named)
  assert first.fit == "next" and first.adopted_config() == {"data.packing_fit": "next"}
  got = next(first)
  assert all((got[k] == want[0][k]).all() for k in stream.FEATURES)
  saved = json.loads(json.dumps(first.get_state()))   # the first resume's checkpoint: next-fit, named
  second = stream.Pipeline(_cfg(sources=src, seq_len=64), tok, 4, seed=0)
  second.set_state(saved)                              # the second resume, under the default again
  assert second.adopted_config() == {"data.packing_fit": "next"}
  for w in want[1:]:
    got = next(second)
    assert all((got[k] == w[k]).all() for k in stream.FEATURES)
  best = stream.Pipeline(_cfg(sources=src, seq_len=64), tok, 4, seed=0).get_state()
  with pytest.raises(DataError, match="the data config differs"):
    stream.Pipeline(_cfg(sources=src, seq_len=64, packing_fit="next"), tok, 4, seed=0).set_state(best)
