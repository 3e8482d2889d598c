"""Minimal-pair readers: CLAMS on the real files (counts, the True/False pairing), a user's TSV / CSV / JSONL
files (tasks/minimal_pairs.py), and a one-line error naming file and line for each kind of bad input."""
import gzip
import json

import pytest

from mlm_jax.errors import ConfigError, DataError
from mlm_jax.tasks import catalogue, clams, minimal_pairs

# Pairs per language in ../shared/data/zeroshot/clams: lines / 2 (SOURCES.md's en 157,335 counts newlines, and
# its English files end without one).
CLAMS_PAIRS = dict(de=47820, en=157346, fr=49360, he=40820, ru=40120)


def test_clams_reader_on_the_real_files(shared_data):
  """Every file of the five languages: the pairs per language, one set per language and phenomenon, pair k
  = the file's lines 2k-1 (True) and 2k (False), and `limit` pairs of each file spread over it (the first pairs
  of a file differ in one attribute only: en/simple_agrmt's first 100 all have a singular subject)."""
  where = clams.folder(str(shared_data))
  sets = clams.read(where)
  assert clams.languages(where) == ["de", "en", "fr", "he", "ru"] and len(sets) == 22 + 4 * 7
  per = {}
  for s in sets:
    per[s.group] = per.get(s.group, 0) + len(s.good)
    assert len(s.good) == len(s.bad) and s.name == f"{s.group}/{s.phenomenon}"
  assert per == CLAMS_PAIRS and sum(per.values()) == 335466
  by_name = {s.name: s for s in sets}
  path = shared_data / clams.FOLDER / "ru" / "subj_rel.txt.gz"
  lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
  s = by_name["ru/subj_rel"]
  assert [l.split("\t", 1)[1] for l in lines[0::2]] == list(s.good)   # True lines
  assert [l.split("\t", 1)[1] for l in lines[1::2]] == list(s.bad)    # each one's False twin
  assert all(l.startswith("True\t") for l in lines[0::2]) and all(l.startswith("False\t") for l in lines[1::2])
  assert (by_name["en/simple_agrmt"].good[0], by_name["en/simple_agrmt"].bad[0]) == ("the author laughs",
                                                                                     "the author laugh")
  fast = clams.read(where, limit=100, langs=("fr", "en"))
  assert [s.group for s in fast][:7] == ["fr"] * 7 and len(fast) == 29
  assert all(len(s.good) == len(s.bad) == min(100, len(by_name[s.name].good)) for s in fast)
  whole = by_name["en/simple_agrmt"]
  spread = next(s for s in fast if s.name == "en/simple_agrmt")
  assert spread.good == tuple(whole.good[i * 140 // 100] for i in range(100)) and len(whole.good) == 140
  singular = lambda pairs: sum(g.split()[1] in {"author", "pilot", "surgeon", "farmer", "manager", "customer",
                                                "officer", "teacher", "senator", "consultant"} for g in pairs)
  assert singular(whole.good[:70]) == 70 and singular(spread.good) == 50   # the first half singular, then plural


def _gz(path, text: str) -> str:
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write(text)
  return str(path)


def test_clams_bad_input_is_one_line(tmp_path):
  with pytest.raises(DataError, match=r"clams: no such folder"):
    clams.read(str(tmp_path / "clams"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(DataError, match=r"empty: no LANG/\*\.txt\.gz files"):
    clams.read(str(tmp_path / "empty"))
  d = tmp_path / "c" / "en"
  d.mkdir(parents=True)
  ok = "True\tthe dog runs\nFalse\tthe dog run\n"
  _gz(d / "a.txt.gz", ok + "True\tthe cats sleep\nTrue\tthe cat sleeps\n")
  with pytest.raises(DataError, match=r"en/a\.txt\.gz:4: expected a 'False' line .* got 'True'"):
    clams.read(str(tmp_path / "c"))
  _gz(d / "a.txt.gz", ok + "False\tthe cats sleeps\n")
  with pytest.raises(DataError, match=r"en/a\.txt\.gz:3: expected a 'True' line"):
    clams.read(str(tmp_path / "c"))
  _gz(d / "a.txt.gz", ok + "True the cats sleep\n")
  with pytest.raises(DataError, match=r"en/a\.txt\.gz:3: expected 'True' or 'False', a tab and a sentence"):
    clams.read(str(tmp_path / "c"))
  _gz(d / "a.txt.gz", ok + "True\tthe cats sleep\n")
  with pytest.raises(DataError, match=r"en/a\.txt\.gz:3: the last 'True' line has no 'False' twin"):
    clams.read(str(tmp_path / "c"))
  with gzip.open(d / "a.txt.gz", "wb") as f:
    f.write(ok.encode() + b"True\tthe caf\xe9 opens\nFalse\tthe cafe open\n")
  with pytest.raises(DataError, match=r"en/a\.txt\.gz:3: not UTF-8 text"):
    clams.read(str(tmp_path / "c"))
  _gz(d / "a.txt.gz", ok)
  with pytest.raises(DataError, match=r"CLAMS has no language 'xx' .* \(it has en\)"):
    clams.read(str(tmp_path / "c"), langs=("xx",))
  assert clams.read(str(tmp_path / "c"))[0].good == ("the dog runs",)


def _write(path, text: str) -> str:
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_a_users_pairs_in_tsv_csv_and_jsonl(tmp_path):
  """The same pairs as TSV (MultiBLiMP's columns), CSV (a sentence with a comma, quoted) and JSONL (RuBLiMP's
  fields, gzipped): one set per phenomenon, in order; several files make one group per file; `limit` pairs a set."""
  rows = [("the dog runs", "the dog run", "SV-#"), ("she sees herself", "she sees himself", "refl"),
          ("the dogs, I think, run", "the dogs, I think, runs", "SV-#")]
  (tmp_path / "tsv").mkdir()
  tsv = _write(tmp_path / "tsv" / "data.tsv", "sen\twrong_sen\tphenomenon\tlemma\n"
               + "".join(f"{g}\t{b}\t{p}\tx\n" for g, b, p in rows))
  csv_text = "good,bad\n" + "".join(f'"{g}","{b}"\n' for g, b, _ in rows)
  csv = _write(tmp_path / "mine.csv", csv_text)
  jsonl = _gz(tmp_path / "ru.jsonl.gz", "".join(json.dumps(dict(source_sentence=g, target_sentence=b, phenomenon=p,
                                                                 id=i)) + "\n" for i, (g, b, p) in enumerate(rows)))
  multiblimp = minimal_pairs.read(tsv, dict(good="sen", bad="wrong_sen"))
  assert [(s.name, s.phenomenon, s.group) for s in multiblimp] == [("SV-#", "SV-#", ""), ("refl", "refl", "")]
  assert multiblimp[0].good == ("the dog runs", "the dogs, I think, run") and multiblimp[1].bad == ("she sees himself",)
  plain = minimal_pairs.read(csv)   # no phenomenon column: one set, the file
  assert [(s.name, s.phenomenon) for s in plain] == [("mine.csv", "")] and plain[0].bad[2] == "the dogs, I think, runs"
  ru = minimal_pairs.read(jsonl, dict(good="source_sentence", bad="target_sentence"), limit=1)
  assert [(s.name, s.good, s.bad) for s in ru] == [("SV-#", ("the dog runs",), ("the dog run",)),
                                                   ("refl", ("she sees herself",), ("she sees himself",))]
  _write(tmp_path / "tsv" / "more.tsv", "sen\twrong_sen\nthe cat sleeps\tthe cat sleep\n")
  both = minimal_pairs.read(str(tmp_path / "tsv" / "*.tsv"), dict(good="sen", bad="wrong_sen"))
  assert [(s.name, s.group) for s in both] == [("data/SV-#", "data"), ("data/refl", "data"), ("more", "more")]
  task = catalogue.select_zeroshot(["clams", f"pairs:mb={tsv},blimp"])
  assert [(t.name, t.kind, t.pattern, t.folder) for t in task] == [
      ("blimp", "blimp", "", "blimp"), ("clams", "clams", "", "clams"), ("mb", "pairs", tsv, "pairs_mb")]


def test_a_users_bad_pairs_are_one_line(tmp_path):
  """A file without the named columns, an empty file, a header without rows, a row without both sentences,
  bad UTF-8, invalid JSON, an unknown format, no file: one line naming file (and line)."""
  cases = [
      ("a.tsv", "good\tsentence\nthe dog runs\tthe dog run\n", {}, r"a\.tsv:1: no column 'bad' \(its columns: good, "
                                                                 r"sentence; name the columns with --pairs_good"),
      ("b.jsonl", '{"sen": "x y", "bad": "y x"}\n', {}, r"b\.jsonl:1: no field 'good'"),
      ("c.tsv", "good\tbad\tphenomenon\nx y\ty x\tp\n", dict(phenomenon="type"), r"c\.tsv:1: no column 'type'"),
      ("d.csv", "", {}, r"d\.csv: no minimal pairs \(an empty file"),
      ("e.tsv", "good\tbad\n\n", {}, r"e\.tsv: no minimal pairs"),
      ("f.tsv", "good\tbad\nx y\ty x\nthe dog runs\n", {}, r"f\.tsv:3: a row without both sentences \(good='the dog "
                                                           r"runs', bad=None\)"),
      ("g.csv", "good,bad\nx y,y x\n\"the dog runs\",\"\"\n", {}, r"g\.csv:3: a row without both sentences"),
      ("h.jsonl", '{"good": "x y", "bad": "y x"}\n{"good": "x", "bad": 3}\n', {}, r"h\.jsonl:2: a row without both"),
      ("i.jsonl", '{"good": "x y", "bad": "y x"}\n{"good": "x",\n', {}, r"i\.jsonl:2: not a JSON object"),
      ("j.txt", "good\tbad\nx y\ty x\n", {}, r"j\.txt: expected a \.tsv, \.csv, \.jsonl file"),
  ]
  for name, text, columns, error in cases:
    path = _write(tmp_path / name, text)
    with pytest.raises(DataError, match=error):
      minimal_pairs.read(path, columns)
  (tmp_path / "k.tsv").write_bytes(b"good\tbad\nx y\ty x\nthe caf\xe9 opens\tthe cafe open\n")
  with pytest.raises(DataError, match=r"k\.tsv:3: not UTF-8 text"):
    minimal_pairs.read(str(tmp_path / "k.tsv"))
  with pytest.raises(DataError, match=r"nothing\*\.tsv: no files match"):
    minimal_pairs.read(str(tmp_path / "nothing*.tsv"))
  for item, error in (("pairs:x", "expected pairs:NAME=GLOB"), ("pairs:a b=x.tsv", "expected pairs:NAME=GLOB"),
                      ("pairs:pos=x.tsv", "'pos' is the suite's own task"), ("clam", "unknown task 'clam'")):
    with pytest.raises(ConfigError, match=error):
      catalogue.select_zeroshot(item)
  with pytest.raises(ConfigError, match="two pairs tasks are named 'a'"):
    catalogue.select_zeroshot(["pairs:a=x.tsv", "pairs:a=y.tsv"])
