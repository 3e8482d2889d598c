"""Hostile input on both paths (streaming pipeline and prepare): long lines, truncated .gz, strict."""
import gzip
import logging

import pytest

from mlm_jax.config import defaults
from mlm_jax.data.store import prepare
from mlm_jax.data.text import stream
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import DataError

ALICE = "corpus/de/gutenberg_kalamine/de_alice.txt.gz"


@pytest.fixture(scope="module")
def tok(shared_data, tmp_path_factory):
  root = tmp_path_factory.mktemp("hostile_tok")
  return spm_training.train([f"de={shared_data / ALICE}"], str(root / "spm"), vocab_size=400,
                               max_sentences_per_language=1500, input_sentence_size=1500, verbose=False)


@pytest.fixture(scope="module")
def bad_files(shared_data, tmp_path_factory):
  """Real German lines, then: one 1 MB line, a truncated .gz, invalid UTF-8, a fake .gz."""
  root = tmp_path_factory.mktemp("hostile")
  with gzip.open(shared_data / ALICE, "rt", encoding="utf-8-sig") as f:
    lines = [line.strip() for line in f if line.strip()][:1500]
  text = "\n".join(lines).encode()
  (root / "long.txt").write_bytes(b"Guten Tag.\n" + b"Wort" * 250_000 + "\u00e4".encode() * 9
                                  + b"\nEnde.\n")
  packed = gzip.compress(text)
  (root / "cut.txt.gz").write_bytes(packed[:len(packed) // 2])
  (root / "utf8.txt").write_bytes(b"gut\n\xff\xfe kaputt\n")
  (root / "fake.txt.gz").write_bytes(b"not gzip at all\n")
  return root


def _cfg(spec, **kw):
  c = defaults.data_defaults()
  c.update(dict(sources=(f"x={spec}",), eval_percent=0.0, seq_len=64, shuffle_buffer=0), **kw)
  return c


def _stream_epoch(cfg, tok):
  stats = stream.new_stats(cfg)
  n = sum(1 for _ in stream.build_dataset(cfg, tok, 8, 0, stats=stats,
                                            repeat=False).as_numpy_iterator())
  return n, stats.as_dict()


def test_streaming_cuts_long_lines(bad_files, tok):
  n, stats = _stream_epoch(_cfg(bad_files / "long.txt", max_line_bytes=1 << 14), tok)
  assert stats["long_lines_cut"] == 1 and n > 0
  with pytest.raises(DataError, match="long lines cut in.*long.txt"):
    next(stream.Pipeline(_cfg(bad_files / "long.txt", max_line_bytes=1 << 14, strict=True),
                           tok, 8, 0))


def test_streaming_warns_about_truncated_gzip_once(bad_files, tok, caplog):
  cfg = _cfg(bad_files / "cut.txt.gz")
  with caplog.at_level(logging.WARNING):
    n, stats = _stream_epoch(cfg, tok)
  assert n > 0 and stats["truncated_files"] == 1
  assert sum("cut.txt.gz is truncated" in r.getMessage() for r in caplog.records) == 1
  strict = stream.Pipeline(_cfg(bad_files / "cut.txt.gz", strict=True), tok, 8, 0)
  with pytest.raises(DataError) as e:
    for _ in range(500):
      next(strict)
  assert "cut.txt.gz is truncated" in str(e.value) and "\n" not in str(e.value)


def test_streaming_strict_refuses_invalid_utf8(bad_files, tok):
  with pytest.raises(DataError, match="invalid utf8 lines in.*utf8.txt"):
    next(stream.Pipeline(_cfg(bad_files / "utf8.txt", strict=True), tok, 8, 0))


def _prepare(root, spec, tok, **kw):
  opts = prepare.Options(sources=(f"x={spec}",), tokenizer=tok.model_path, eval_percent=0.0,
                         **kw)
  return prepare.prepare(opts, str(root), progress_s=1e9, log=lambda s: None)


def test_prepare_hostile_input(bad_files, tok, tmp_path, caplog):
  m = _prepare(tmp_path / "a", bad_files / "long.txt", tok, max_line_bytes=1 << 14)
  stats = m["sources"]["x"]["stats"]
  assert stats["long_lines_cut"] == 61 and m["sources"]["x"]["documents"] == 64
  with caplog.at_level(logging.WARNING):
    m = _prepare(tmp_path / "b", bad_files / "cut.txt.gz", tok)
  assert m["sources"]["x"]["stats"]["truncated_files"] == 1 and m["sources"]["x"]["documents"]
  assert sum("cut.txt.gz is truncated" in r.getMessage() for r in caplog.records) == 1
  m = _prepare(tmp_path / "c", bad_files / "utf8.txt", tok)
  assert m["sources"]["x"]["stats"]["invalid_utf8_lines"] == 1
  for name, match in (("cut.txt.gz", "cut.txt.gz: truncated files"),
                      ("utf8.txt", "utf8.txt: invalid utf8 lines"),
                      ("long.txt", "long.txt: long lines cut")):
    with pytest.raises(DataError, match=match):
      _prepare(tmp_path / f"strict_{name}", bad_files / name, tok, strict=True,
               max_line_bytes=1 << 14)
  with pytest.raises(DataError, match="cannot read .*fake.txt.gz"):
    _prepare(tmp_path / "d", bad_files / "fake.txt.gz", tok)
