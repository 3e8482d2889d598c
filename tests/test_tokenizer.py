"""Tokenizer training and loading on real multilingual text from ../shared/data.

One session-scoped unigram model (6 languages, 3 scripts, deliberately unbalanced corpora) is
trained in ~10 s; a BPE/BERT-layout model covers the other options.
"""
import gzip
import json
import shutil
import sys

import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from mlm_jax.data.text import sources
from mlm_jax.data.tokenizers import base as tokenizer_base
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import UserError

# language: (file under corpus/, TSV text column or None, training lines). Armenian gets far
# fewer lines than English so that the alpha sampling has something to fix.
LANGS = {
    "en": ("en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz", 1, 4000),
    "de": ("de/leipzig/deu_mixed-typical_2011_10K-sentences.txt.gz", 1, 2000),
    "fr": ("fr/leipzig/fra_mixed-typical_2012_10K-sentences.txt.gz", 1, 2000),
    "ru": ("ru/tatoeba_cc0_rus.tsv.gz", 2, 2000),
    "el": ("el/elwiki_truncated_clean.txt.gz", None, 300),
    "hy": ("hy/hywiki_truncated_clean.txt.gz", None, 150),
}
HELD_OUT = 60
VOCAB = 4000


def _slice(path, field, n):
  lines = []
  with gzip.open(path, "rt", encoding="utf-8") as f:
    for line in f:
      line = line.rstrip("\r\n")
      if field is not None:
        line = line.split("\t")[field]
      if line.strip():
        lines.append(line)
      if len(lines) >= n:
        break
  return lines


@pytest.fixture(scope="session")
def corpus(shared_data, tmp_path_factory):
  """{lang: held-out lines}; training slices written to <tmp>/<lang>/train.txt."""
  root = tmp_path_factory.mktemp("tok_corpus")
  held = {}
  for lang, (rel, field, n) in LANGS.items():
    lines = _slice(shared_data / "corpus" / rel, field, n + HELD_OUT)
    (root / lang).mkdir()
    (root / lang / "train.txt").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    held[lang] = lines[n:]
  return root, held


@pytest.fixture(scope="session")
def xlmr_tok(corpus, tmp_path_factory):
  root, _ = corpus
  out = tmp_path_factory.mktemp("tok_xlmr") / "spm"
  return spm_training.train([f"{root}/*/train.txt"], str(out), vocab_size=VOCAB, layout="xlmr",
                               alpha=0.3, verbose=False)


@pytest.fixture(scope="session")
def bert_tok(corpus, tmp_path_factory):
  root, _ = corpus
  out = tmp_path_factory.mktemp("tok_bert") / "spm"
  return spm_training.train({"en": f"{root}/en/train.txt", "ru": f"{root}/ru/train.txt"}, str(out),
                               vocab_size=1500, layout="bert", model_type="bpe", verbose=False)


def test_xlmr_special_ids(xlmr_tok):
  t = xlmr_tok
  assert (t.bos_id, t.pad_id, t.eos_id, t.unk_id, t.mask_id) == (0, 1, 2, 3, VOCAB - 1)
  assert [t.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
  assert t.id_to_piece(VOCAB - 1) == "<mask>" and t.piece_to_id("<mask>") == VOCAB - 1
  assert t.vocab_size == VOCAB and t.special_ids == (0, 1, 2, 3, VOCAB - 1)
  assert t.layout == "xlmr"
  vocab_lines = open(t.model_path[:-len(".model")] + ".vocab", encoding="utf-8").read().splitlines()
  assert len(vocab_lines) == VOCAB and vocab_lines[-1].startswith("<mask>\t")
  again = tokenizer_load.load(t.model_path)
  assert again.special_ids == t.special_ids and again.vocab_size == VOCAB


def test_bert_layout_bpe(bert_tok):
  t = bert_tok
  assert [t.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert (t.pad_id, t.unk_id, t.bos_id, t.eos_id, t.mask_id) == (0, 1, 2, 3, 4)
  assert t.layout == "bert" and t.vocab_size == 1500
  proto = t.processor.serialized_model_proto()
  from sentencepiece import sentencepiece_model_pb2
  m = sentencepiece_model_pb2.ModelProto()
  m.ParseFromString(proto)
  assert m.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE


def test_heldout_roundtrip(xlmr_tok, corpus):
  _, held = corpus
  for lang, lines in held.items():
    for line in lines:
      ids = xlmr_tok.encode(line)
      assert xlmr_tok.decode(ids) == xlmr_tok.normalize(line), (lang, line)
      assert not set(ids) & set(xlmr_tok.special_ids) - {xlmr_tok.unk_id}


def test_fertility_within_2x_of_english(xlmr_tok, corpus):
  _, held = corpus

  def tokens_per_word(lines):
    return sum(len(xlmr_tok.encode(s)) for s in lines) / sum(len(s.split()) for s in lines)

  en = tokens_per_word(held["en"])
  ratios = {lang: tokens_per_word(lines) / en for lang, lines in held.items()}
  assert all(r <= 2.0 for r in ratios.values()), ratios


def test_language_weights_follow_alpha(xlmr_tok):
  meta = json.load(open(tokenizer_base.special_ids_path(xlmr_tok.model_path)))
  langs = meta["languages"]
  assert set(langs) == set(LANGS) and meta["alpha"] == 0.3
  total = sum(v["lines"] ** 0.3 for v in langs.values())
  for v in langs.values():
    assert v["weight"] == pytest.approx(v["lines"] ** 0.3 / total)
  # Armenian has 150/4000 of English's lines but gets more than a third of its share.
  assert langs["hy"]["weight"] / langs["en"]["weight"] > 0.33


def test_the_training_read_keeps_every_line_in_order_across_its_blocks(shared_data):
  """The tokenizer's inputs are read in blocks of lines (sources.READ_BLOCK): every line of a 10,000-line
  file (blocks of 4,096 and a part), in order, against the file read directly; below the cap a uniform sample."""
  import random
  path = shared_data / "corpus/en/leipzig/eng_news-typical_2016_10K-sentences.txt.gz"
  with gzip.open(path, "rt", encoding="utf-8") as f:
    want = [line.rstrip("\n").split("\t")[1].strip() for line in f]
  want = [line for line in want if line]
  assert len(want) > 2 * sources.READ_BLOCK
  n, kept = spm_training._reservoir([f"tsv:1:{path}"], 10**6, random.Random(0))
  assert n == len(want) and kept == want
  n, sample = spm_training._reservoir([f"tsv:1:{path}"], 100, random.Random(0))
  assert n == len(want) and len(sample) == 100 and set(sample) <= set(want)
  assert sum(want.index(line) >= 2 * sources.READ_BLOCK for line in sample) > 5   # the last block is drawn


@pytest.mark.parametrize("which", ["xlmr_tok", "bert_tok"])
def test_tf_text_gives_python_ids(which, request, corpus):
  tok = request.getfixturevalue(which)
  _, held = corpus
  lines = [s for lang_lines in held.values() for s in lang_lines] + ["a <mask> b [MASK] c", ""]
  tft = tf_text.SentencepieceTokenizer(model=tok.model_proto, out_type=tf.int32)
  assert int(tft.vocab_size()) == tok.vocab_size
  got = tft.tokenize(tf.constant(lines)).to_list()
  assert got == [tok.encode(s) for s in lines]
  assert all(tok.mask_id not in ids for ids in got)  # never emitted from text, even "<mask>"


def test_load_infers_ids_without_json(xlmr_tok, tmp_path):
  shutil.copy(xlmr_tok.model_path, tmp_path / "m.model")
  t = tokenizer_load.load(str(tmp_path / "m.model"))
  assert (t.layout, t.mask_id, t.pad_id) == ("xlmr", VOCAB - 1, 1)


def test_word_start_table(xlmr_tok):
  table = xlmr_tok.word_start_table()
  assert len(table) == VOCAB
  assert all(table[i] == 1 for i in xlmr_tok.special_ids)
  for i in range(4, 200):
    assert table[i] == int(xlmr_tok.id_to_piece(i).startswith("\u2581") or
                           xlmr_tok.processor.is_control(i) or xlmr_tok.processor.is_unknown(i))


def test_load_errors(tmp_path):
  with pytest.raises(UserError, match="missing.model"):
    tokenizer_load.load(str(tmp_path / "missing.model"))
  (tmp_path / "junk.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match="junk.model is not a sentencepiece model"):
    tokenizer_load.load(str(tmp_path / "junk.model"))


def test_train_tool(corpus, tmp_path, capsys):
  sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tools"))
  import train_tokenizer
  root, _ = corpus
  out = tmp_path / "tool"
  rc = train_tokenizer.main([f"--input=en={root}/en/train.txt", f"--input=el={root}/el/train.txt",
                             f"--out={out}", "--vocab_size=800", "--layout=bert"])
  assert rc == 0
  captured = capsys.readouterr()
  assert "[tokenizer] read el" in captured.err and captured.out.strip() == f"{out}.model"
  assert tokenizer_load.load(f"{out}.model").mask_id == 4
  rc = train_tokenizer.main([f"--input={tmp_path}/nothing/*.txt", f"--out={out}2", "--quiet"])
  assert rc == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == f"error: no files match '{tmp_path}/nothing/*.txt'"


def test_vocab_too_large_for_text_is_one_line(corpus, tmp_path):
  root, _ = corpus
  small = tmp_path / "small.txt"
  small.write_text("\n".join(open(root / "en/train.txt").read().splitlines()[:50]) + "\n")
  with pytest.raises(ValueError) as e:
    spm_training.train([f"en={small}"], str(tmp_path / "big"), vocab_size=20000, verbose=False)
  assert "\n" not in str(e.value) and str(e.value).startswith("vocab_size=20000 is too large")


def test_word_stats_against_the_processor(xlmr_tok, corpus, tmp_path, capsys):
  """Fertility, split words, unknown and byte pieces against sentencepiece's own segmentation of whole
  lines (pieces grouped into words at each ▁), and tools/tokenizer_stats.py's table and JSON."""
  from mlm_jax.data.tokenizers import word_stats
  _, held = corpus
  sp = xlmr_tok.processor
  for lang in ("en", "ru", "hy"):
    lines = held[lang] + ["漢字 and ☃ snow"]
    got = word_stats.word_stats(xlmr_tok, lines)
    words = pieces = split = unknown = byte = 0
    for line in lines:
      ids = sp.encode(line)
      groups = []
      for i in ids:
        if sp.id_to_piece(i).startswith("\u2581") or not groups:
          groups.append([])
        groups[-1].append(i)
      assert len(groups) == len(line.split()), line
      words += len(groups)
      pieces += len(ids)
      split += sum(len(g) > 1 for g in groups)
      unknown += sum(sp.is_unknown(i) for i in ids)
      byte += sum(sp.is_byte(i) for i in ids)
    assert (got.lines, got.words, got.pieces, got.split_words, got.unknown_pieces, got.byte_pieces) == (
        len(lines), words, pieces, split, unknown, byte), lang
    assert got.byte_pieces > 0 and 1.0 < got.fertility == pieces / words
  # The tool: a table row per language, the same figures in its JSON line; bad input is one line.
  sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tools"))
  import tokenizer_stats
  (tmp_path / "ru.txt").write_text("\n".join(held["ru"]) + "\n\n", encoding="utf-8")
  assert tokenizer_stats.main([f"--tokenizer=multi={xlmr_tok.model_path}", f"--text=ru={tmp_path}/ru.txt"]) == 0
  out = capsys.readouterr().out.strip().splitlines()
  assert out[2].startswith(f"| ru | {sum(len(s.split()) for s in held['ru']):,} |")
  assert json.loads(out[-1])["ru"]["multi"] == word_stats.word_stats(xlmr_tok, held["ru"]).as_dict()
  assert tokenizer_stats.main([f"--tokenizer=multi={xlmr_tok.model_path}", f"--text=ru={tmp_path}/no*.txt"]) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: no files match '{tmp_path}/no*.txt'"
