"""The downstream suite: readers and splits on the real shared files, the table, and the suite itself
(JSON, resume, cross-lingual columns) on round 2's 1-layer, 16-wide workdir, 2 steps a run.
"""
import gzip
import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

from mlm_jax.errors import ConfigError, DataError
from mlm_jax.tasks import catalogue, readers
from mlm_jax.finetuning import suite

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "round2"


def _ds(shared_data, *parts) -> str:
  return str(shared_data.joinpath("downstream", *parts))


# ------------------------------------------------------------------------------------------
# Readers on the real files
# ------------------------------------------------------------------------------------------
def test_trec_reader(shared_data):
  train = readers.read_trec([_ds(shared_data, "question_classification_trec", "train.txt")])
  test = readers.read_trec([_ds(shared_data, "question_classification_trec", "test.txt")])
  assert len(train) == 5452 and len(test) == 500
  assert {e.label for e in train} == {"ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"}
  assert train[0].label == "DESC" and train[0].text == "How did serfdom develop in and then leave Russia ?"
  assert sum("\ufffd" in e.text for e in train) == 1   # the one invalid byte, replaced
  fine = readers.read_trec([_ds(shared_data, "question_classification_trec", "test.txt")], fine=True)
  assert all(":" in e.label for e in fine) and len({e.label for e in fine}) > 6


@pytest.mark.parametrize("lang", ["de", "en"])   # de: multiword tokens (zur = zu dem); en: 7 empty nodes
def test_conllu_reader_skips_multiword_tokens_and_empty_nodes(shared_data, lang):
  path = _ds(shared_data, "pos_ud_pud", f"{lang}_pud-ud-test.conllu.gz")
  sentences = readers.read_conllu([path])
  lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
  words = [l.split("\t") for l in lines if re.match(r"\d+\t", l)]
  skipped = [l for l in lines if re.match(r"\d+[-.]\d+\t", l)]
  assert len(sentences) == 1000 and skipped
  assert sum(len(s.words) for s in sentences) == len(words)
  assert [w for s in sentences for w in s.words] == [c[1] for c in words]
  assert [t for s in sentences for t in s.tags] == [c[3] for c in words]
  assert sentences[0].group == sentences[0].id == "n01001011"
  if lang == "de":   # "zur" is a surface token over "zu" + "der": only the syntactic words are tagged
    s = next(s for s in sentences if "zu" in s.words and "der" in s.words)
    assert "zur" not in s.words or s.words.count("zur") == 0


# ------------------------------------------------------------------------------------------
# Splits: parallel data is split by group, the same groups in every language
# ------------------------------------------------------------------------------------------
def _split(task_name, shared_data):
  """(training groups, {lang: eval groups}) of a suite task, split as the suite splits it."""
  from mlm_jax.tasks import task as task_lib
  t = catalogue.BY_NAME[task_name]
  config = catalogue.load_config(t, "fast", str(shared_data))
  config.task.max_eval_examples = 0
  train, evals = task_lib.split(config.task)
  out = {"en": {e.group for e in evals}}
  for name, files in catalogue.extra_evals(t, str(shared_data)).items():
    out[name[3:]] = {e.group for e in task_lib.eval_examples(config.task, files)}
  return {e.group for e in train}, out


def test_pud_split_by_sent_id_across_languages(shared_data):
  train, evals = _split("pos", shared_data)
  assert set(evals) == {"en", "ar", "de", "es", "fr", "hi", "ru", "zh"}
  assert 700 <= len(train) <= 900 and all(g.startswith(("n", "w")) for g in train)
  for lang, groups in evals.items():
    assert groups == evals["en"], lang                     # the same held-out sentences in every language
    assert not groups & train, lang                        # no translation of a training sentence


def test_xquad_split_by_title_across_languages(shared_data):
  train, evals = _split("xquad", shared_data)
  assert len(evals) == 12 and "Super_Bowl_50" in train | evals["en"]
  for lang, titles in evals.items():
    assert titles == evals["en"] and titles and not titles & train, lang


def test_bad_input_is_one_line(tmp_path):
  with pytest.raises(ConfigError, match=r"--tasks: unknown task 'glue' \(expected some of polarity, "):
    catalogue.select("pos,glue")
  with pytest.raises(DataError, match="no such folder"):
    catalogue.data_dir(str(tmp_path))
  assert [t.name for t in catalogue.select("xquad, trec")] == ["trec", "xquad"]


# ------------------------------------------------------------------------------------------
# The suite on a tiny model
# ------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_workdir(tmp_path, monkeypatch):
  """Round 2's pretraining workdir (1 layer, 16 wide, 32 positions; tests/fixtures/round2) with its
  token store, whose tokenizer its config.json names relative to the folder holding both."""
  for name in ("workdir", "store"):
    shutil.copytree(FIXTURE / name, tmp_path / name)
  monkeypatch.chdir(tmp_path)
  return str(tmp_path / "workdir")


def test_table_and_json_from_seed_results():
  """Mean ± sample std over seeds in percent, the average over tasks, zero-shot means apart."""
  from mlm_jax.finetuning import suite_report
  rec = lambda task, seed, score, xl=None: dict(task=task, seed=seed, score=score, scores={"exact_match": score / 2},
                                                seconds=10.0, crosslingual=xl or {})
  results = {"sms_spam": [rec("sms_spam", 0, 0.9), rec("sms_spam", 1, 0.8)],
             "xquad": [rec("xquad", 0, 0.5, {"de": 0.4, "zh": 0.1, "th": 0.2}),
                       rec("xquad", 1, 0.3, {"de": 0.2, "zh": 0.3, "th": 0.0})]}
  info = dict(init_from="/m", mode="fast", num_seeds=2, random_init=True, pretrain_languages=["en", "de"],
              pretrain_languages_from="--pretrain_languages")
  summary = suite_report.summarize([catalogue.BY_NAME["sms_spam"], catalogue.BY_NAME["xquad"]], results, info)
  spam, qa = summary["tasks"]["sms_spam"], summary["tasks"]["xquad"]
  assert spam["mean"] == pytest.approx(85.0) and spam["std"] == pytest.approx(np.std([90, 80], ddof=1))
  assert qa["mean"] == pytest.approx(40.0) and qa["exact_match"] == pytest.approx(20.0)
  assert summary["average"] == pytest.approx(62.5)
  assert qa["crosslingual"] == pytest.approx({"de": 30.0, "th": 10.0, "zh": 20.0})
  assert qa["crosslingual_seen_mean"] == pytest.approx(30.0) and qa["crosslingual_other_mean"] == pytest.approx(15.0)
  table = suite_report.format_table(summary).splitlines()
  assert "RANDOM INIT" in table[0] and re.match(r"sms_spam +macro-F1 +85\.0 ± 7\.1 +2 +0m20s$", table[3])
  assert re.match(r"xquad +F1 +40\.0 ± 14\.1 +2 +0m20s +\(EM 20\.0\)$", table[4])
  assert re.match(r"average \(fine-tuning\) +62\.5 +\(2 tasks\)$", table[5])
  assert re.match(r"task +en +de\* +th +zh +pretrained +others$", table[-2])
  assert re.match(r"xquad +40\.0 +30\.0 +10\.0 +20\.0 +30\.0 +15\.0$", table[-1])


TINY = {"train.steps": 2, "train.log_every": 1, "task.max_train_examples": 64, "task.max_eval_examples": 12,
        "train.eval_batch_size": 16}


def test_suite_resume_and_crosslingual_columns(tiny_workdir, shared_data, tmp_path):
  """The real suite on a tiny model: POS (zero-shot in 7 languages) with one seed, then re-run with two:
  the finished seed is read back, not trained again; after more pretraining (a newer checkpoint) or
  with other --set overrides, a finished seed is trained again, with one line saying why."""
  out, lines = str(tmp_path / "suite"), []
  kw = dict(tasks="pos", fast=True, pretrain_langs="en,de", data=str(shared_data), overrides=TINY)
  first = suite.run_suite(tiny_workdir, out, seeds=1, log=lines.append, **kw)
  assert [l for l in lines if l.startswith("[downstream]")] == [
      "[downstream] pos seed 0: started (2 steps x 16, seq_len 96 -> 32 (the model's positions))",
      f"[downstream] pos seed 0: finished, token_accuracy {first['tasks']['pos']['mean']:.1f} "
      f"({first['tasks']['pos']['seconds']:.0f} s)"]
  lines.clear()
  summary = suite.run_suite(tiny_workdir, out, seeds=2, log=lines.append, **kw)
  assert [l.split(":")[0] + (" skipped" if "skipped" in l else "") for l in lines if l.startswith("[downstream]")] == [
      "[downstream] pos seed 0 skipped", "[downstream] pos seed 1", "[downstream] pos seed 1"]
  saved = json.load(open(os.path.join(out, "downstream.json")))
  assert saved == json.loads(json.dumps(summary)) and saved["mode"] == "fast" and saved["num_seeds"] == 2
  row = saved["tasks"]["pos"]
  assert row["metric"] == "token_accuracy" and row["seeds"] == [0, 1] and 0 < row["mean"] <= 100
  per_seed = [json.load(open(os.path.join(out, "pos", f"seed{s}", suite.RESULT_FILE))) for s in (0, 1)]
  assert row["scores"] == pytest.approx([100 * r["score"] for r in per_seed])
  assert row["scores"][0] == pytest.approx(first["tasks"]["pos"]["mean"])
  assert saved["average"] == pytest.approx(row["mean"]) and row["std"] == pytest.approx(np.std(row["scores"], ddof=1))
  # Zero-shot columns: every other PUD language, scored with the English-trained checkpoint.
  assert set(row["crosslingual"]) == {"ar", "de", "es", "fr", "hi", "ru", "zh"}
  assert all(set(r["crosslingual"]) == set(row["crosslingual"]) for r in per_seed)
  assert row["crosslingual_seen_mean"] == pytest.approx(row["crosslingual"]["de"])
  table = open(os.path.join(out, "downstream.txt")).read()
  assert lines[-1] == table.rstrip("\n") and re.search(r"^task +en +ar +de\* +es", table, re.M)
  assert re.search(r"^pos( +\d+\.\d){10}$", table, re.M)
  # Each language is scored on its own file: scoring one language for all would give one number.
  files = catalogue.extra_evals(catalogue.BY_NAME["pos"], str(shared_data))
  assert all(os.path.basename(f).startswith(f"{k[3:]}_") for k, fs in files.items() for f in fs)
  assert len(set(per_seed[0]["crosslingual"].values())) >= 5, per_seed[0]["crosslingual"]
  # Stale results: the same command after more pretraining (a newer checkpoint step), then other --set.
  ckpt = os.path.join(tiny_workdir, "checkpoints")
  os.rename(os.path.join(ckpt, "2"), os.path.join(ckpt, "7"))
  lines.clear()
  suite.run_suite(tiny_workdir, out, seeds=1, log=lines.append, **kw)
  assert [l for l in lines if l.startswith("[downstream]")][0] == (
      "[downstream] pos seed 0: result of another model or config (init_step 2 -> 7); training again "
      f"(the old folder is {os.path.join(out, 'pos', 'seed0.stale')})")
  assert json.load(open(os.path.join(out, "pos", "seed0", suite.RESULT_FILE)))["depends_on"]["init_step"] == 7
  # what else a result depends on (each would train it again, as the newer checkpoint did)
  task, saved = catalogue.BY_NAME["pos"], per_seed[0]["depends_on"]
  config = catalogue.load_config(task, "fast", str(shared_data))
  config.seed, config.random_init = 0, False
  config.train.eval_every = 0
  for k, v in TINY.items():
    section, name = k.rsplit(".", 1)
    config[section][name] = v
  suite.fit_to_model(config, tiny_workdir)
  os.rename(os.path.join(ckpt, "7"), os.path.join(ckpt, "2"))
  same = dict(init_from=tiny_workdir, mode="fast", random_init=False, overrides=TINY)
  assert suite.depends_on(task, config, **same) == saved
  for change in (dict(mode="full"), dict(random_init=True), dict(overrides=dict(TINY, **{"train.steps": 3}))):
    assert suite.depends_on(task, config, **dict(same, **change)) != saved, change
  config.train.steps = 3
  assert suite.depends_on(task, config, **same) != saved


def test_qa_windows_keep_their_overlap_when_the_suite_shortens_them(tiny_workdir, shared_data):
  """XQuAD's config at the tiny model's 32 positions: doc_stride is clamped to half a window (the note
  says so), so consecutive windows share context and a real answer that straddles the edge of the
  windows the unclamped stride gives lies whole in one of them."""
  from mlm_jax.data.tokenizers import load as tokenizer_load
  from mlm_jax.tasks import qa
  config = catalogue.load_config(catalogue.BY_NAME["xquad"], "fast", str(shared_data))
  given = config.task.doc_stride
  note = suite.fit_to_model(config, tiny_workdir)
  q_len, stride = config.task.max_query_length, config.task.doc_stride
  assert note == (f"seq_len 128 -> 32 (the model's positions), doc_stride {given} -> {stride} "
                  "(half a window, so windows overlap)")
  tok = tokenizer_load.load(str(FIXTURE / "store" / "tokenizer" / "spm.model"))
  examples = readers.read_squad([_ds(shared_data, "qa_xquad", "xquad.en.json.gz")])

  def found(ex, doc_stride):
    arrays, feats = qa.encode([ex], tok, 32, 1, q_len, doc_stride)
    return bool(arrays["start_position"].any()), feats

  # the first question whose (short) answer no window of the unclamped stride holds whole
  straddling = next(ex for ex in examples[:300] if len(tok.encode(ex.answers[0]["text"])) <= 4
                    and not found(ex, given)[0])
  hit, feats = found(straddling, stride)
  assert hit
  spans = [set(f.char_spans.values()) for f in feats]
  assert len(spans) > 2 and all(a & b for a, b in zip(spans, spans[1:]))
